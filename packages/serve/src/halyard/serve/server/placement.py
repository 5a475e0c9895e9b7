"""Where the served model runs: one device, split over several (``--tensor``, tensor parallel), or several
copies of the engine (``--replicas``, data parallel, each copy on its own devices); `build_engine` makes the
engine the server drives (`halyard.serve.Engine` or `halyard.serve.Replicas`: the same interface)."""

from __future__ import annotations

import re
from typing import Any

import jax

from halyard.models import CausalLM
from halyard.serve.config import EngineConfig
from halyard.serve.engine import Engine
from halyard.serve.replicas import Replicas
from halyard.serve.server.loading import ServedModel
from halyard.serve.server.options import OptionError
from halyard.shard import Layout, MeshSpec


def tensor_parallel(model: CausalLM, tensor: int) -> tuple[CausalLM, dict[str, Any]]:
    """``model`` split over ``tensor`` devices (``--tensor``): the placed model and the engine's ``mesh`` and
    ``layout`` (none for one device).

    Raises:
        OptionError: fewer devices than ``tensor``, or axes of the model that do not divide over them.
    """
    if tensor == 1:
        return model, {}
    devices = jax.devices()
    if not 1 <= tensor <= len(devices):
        raise OptionError(f"--tensor {tensor}: there are {len(devices)} devices; give 1 to {len(devices)}")
    try:
        mesh = MeshSpec(data=1, tensor=tensor).build(devices[:tensor])
        layout = Layout.tensor_parallel(min_shard=1)  # every head, MLP and vocabulary axis split
        placed = jax.device_put(model, layout.shardings(model, mesh))
    except ValueError as error:
        raise OptionError(f"--tensor {tensor}: {_not_dividing(error)}") from None
    return placed, {"mesh": mesh, "layout": layout}


def build_engine(
    served: ServedModel, config: EngineConfig | None, *, tensor: int = 1, replicas: int = 1
) -> Engine | Replicas:
    """The engine of ``served``: ``replicas`` copies, each on ``tensor`` devices of its own.

    Raises:
        OptionError: too few devices, or a model that does not divide over ``tensor``.
        ValueError: ``config`` does not fit the model (see `halyard.serve.EngineConfig.context_for`).
    """
    text = served.tokenizer
    if served.draft is not None and (tensor, replicas) != (1, 1):
        raise OptionError("--speculative draft=MODEL runs on one device: leave --tensor and --replicas at 1")
    if replicas == 1:
        model, placement = tensor_parallel(served.model, tensor)
        return Engine(
            model,
            config,
            decode=text.decode,
            eos_token_ids=served.eos_token_ids,
            draft=served.draft,
            **placement,
        )
    if tensor < 1 or replicas < 1 or replicas * tensor > len(jax.devices()):
        raise OptionError(
            f"--replicas {replicas} of --tensor {tensor} device(s) need {replicas * tensor} devices, "
            f"there are {len(jax.devices())}"
        )
    try:
        return Replicas(
            served.model,
            replicas,
            config,
            devices_per_replica=tensor,
            decode=text.decode,
            eos_token_ids=served.eos_token_ids,
        )
    except ValueError as error:
        if "does not divide" not in str(error):
            raise
        raise OptionError(f"--tensor {tensor}: {_not_dividing(error)}") from None


def _not_dividing(error: ValueError) -> str:
    # The layout lists each weight that stays whole and why; the axes that do not divide say it all.
    reasons = dict.fromkeys(re.findall(r"\w+=\d+ does not divide over tensor=\d+", str(error)))
    if not reasons:
        return " ".join(str(error).split())
    return ", ".join(reasons) + "; choose a --tensor that divides them"
