"""A LoRA run's frozen base: which weights it is (the reference its checkpoints record) and loading them.

The base is what ``trainer.init`` names when the run starts: a Hugging Face folder (``hf:PATH``), a
checkpoint's weights (``checkpoint:PATH`` or ``weights:PATH``, of a run without LoRA), or the
initialisation from ``trainer.seed`` (``auto`` / ``scratch``). Checkpoints hold only the adapters and
this reference; a resumed run reloads the base from the reference of its latest checkpoint
(`halyard.train.run.sources.load_lora_base` loads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from halyard.models import MupConfig
from halyard.models.lora import check_targets
from halyard.train.checkpoint.commit_marker import read_commit_marker
from halyard.train.checkpoint.discovery import latest_complete, resolve_checkpoint
from halyard.train.checkpoint.layout import step_directory
from halyard.train.config.errors import ConfigError
from halyard.train.run_config import TrainConfig
from halyard.train.user_errors import one_line

BASE_PREFIXES = ("hf:", "checkpoint:", "weights:")
"""The ``trainer.init`` sources that name a base; every other mode starts from the seed's initialisation."""
METADATA_KEY = "lora"
"""The checkpoint metadata entry holding the base reference and the adapters' settings."""


@dataclass(frozen=True)
class LoraBase:
    """The frozen base of a LoRA run.

    Attributes:
        params: the base model (no adapters), placed in the run's layout.
        reference: what checkpoints record (`base_reference`).
    """

    params: Any
    reference: dict[str, Any]


def base_reference(config: TrainConfig, base: str) -> dict[str, Any]:
    """The checkpoint metadata of a LoRA run on ``base`` (``hf:PATH``, ``checkpoint:PATH``,
    ``weights:PATH`` or ``scratch``): the base, the seed (a scratch base is drawn from it), and the
    adapters' rank, alpha and targets (a resume with other ones is refused)."""
    lora = config.lora
    return {
        "base": base,
        "seed": config.trainer.seed,
        "rank": lora.rank,
        "alpha": lora.alpha,
        "target_modules": sorted(lora.target_modules),
    }


def recorded_reference(checkpoint: Path) -> dict[str, Any] | None:
    """The LoRA reference a checkpoint step directory records, None for a run without LoRA."""
    reference = read_commit_marker(checkpoint, check_files=False).extra_metadata.get(METADATA_KEY)
    return dict(reference) if reference is not None else None


def check_lora(config: TrainConfig, model_config: Any) -> None:
    """Preflight: the targets exist in the model and the family supports LoRA; ``trainer.init`` does not name
    a LoRA run's checkpoint (it holds adapters, not a whole model); the run's own checkpoints were written
    with LoRA on exactly when it is on now.

    Raises:
        ConfigError: naming the key and the fix.
    """
    init = config.trainer.init
    if init.startswith(("checkpoint:", "weights:")):
        try:
            path = resolve_checkpoint(init.split(":", 1)[1])
        except FileNotFoundError:
            path = None  # check_init_source names the missing checkpoint
        if path is not None and recorded_reference(path) is not None:
            raise ConfigError(
                f"trainer.init={init} holds LoRA adapters, not a whole model: export that run merged "
                "(halyard export --run RUN --lora merge --out FOLDER) and start from trainer.init=hf:FOLDER"
            )
    checkpoints = Path(config.trainer.run_dir) / "checkpoints"
    latest = latest_complete(checkpoints) if checkpoints.is_dir() else None
    own = recorded_reference(step_directory(checkpoints, latest)) if latest is not None else None
    if latest is not None and (own is not None) != config.lora.enabled:
        written = f"with LoRA adapters of rank {own['rank']}" if own is not None else "without LoRA"
        raise ConfigError(
            f"lora.rank={config.lora.rank}, but this run's checkpoints in {checkpoints} were written {written}: "
            f"set lora.rank: {own['rank'] if own is not None else 0} to resume them, or start a new trainer.run_dir"
        )
    if not config.lora.enabled:
        return
    if isinstance(model_config, MupConfig):
        raise ConfigError(
            "lora.rank > 0 with a mup model: muP's per-parameter learning rates do not cover adapters"
        )
    shapes = jax.eval_shape(model_config.init, jax.random.PRNGKey(0))
    try:
        check_targets(shapes, config.lora.target_modules)
    except ValueError as error:
        raise ConfigError(one_line(str(error))) from None


def base_source(config: TrainConfig, recorded: dict[str, Any] | None) -> str:
    """The base to load: ``trainer.init``'s, which must be the one the run's checkpoints record (``auto``
    and ``resume`` stand for it, except for a Hugging Face base, whose config.json gives the model's shape).

    Raises:
        ConfigError: the checkpoints record another base or other adapters than the config asks for.
    """
    init = config.trainer.init
    asked = init if init.startswith(BASE_PREFIXES) else "scratch"
    if recorded is None:
        return asked
    base = str(recorded["base"])
    if asked != base and (asked != "scratch" or base.startswith("hf:")):
        raise ConfigError(
            f"trainer.init={init}, but this run's checkpoints hold adapters trained on the base {base}: set "
            f"trainer.init={base} to resume them, or start a new trainer.run_dir"
        )
    expected = base_reference(config, base)
    for key in ("rank", "alpha", "target_modules"):
        if expected[key] != recorded.get(key):
            raise ConfigError(
                f"lora.{key}={expected[key]!r}, but this run's checkpoints hold adapters with {recorded.get(key)!r}: "
                "give the original value to resume, or start a new trainer.run_dir"
            )
    return base


def checkpoint_metadata(base: LoraBase | None) -> dict[str, Any]:
    """What a checkpoint records besides the data position: ``{"lora": reference}`` for a LoRA run."""
    return {} if base is None else {METADATA_KEY: base.reference}
