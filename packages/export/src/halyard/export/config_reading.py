"""``config.json`` -> Halyard model configs, read without `transformers`.

A generic engine over the families' Hugging Face specs (`halyard.models.hf.HfFamily`, one in each family's
``hf.py``): the spec whose ``model_type`` (or architecture) the file names supplies the required keys, the
defaults and the reader. Each key is decided by the spec's `KeyRule` (explained in
`halyard.models.hf.key_rule`): keys `transformers` reads for the architecture are implemented, accepted only
with the value Halyard implements, or refused naming the key and value; the others cannot change what the
model computes and are ignored (listed at debug level), unless ``strict=True``. Quantized checkpoints and
checkpoints that need their own Python code are refused with what to do instead.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from halyard.export.errors import UnsupportedModelError
from halyard.export.quantization import quantization_refusal
from halyard.models import ModelConfig
from halyard.models.hf import HfFamily, KeyRule, hf_families

logger = logging.getLogger("halyard.export")

# auto_map entries that replace the model's code (an AutoTokenizer entry does not change the model)
_MODEL_CODE_ENTRIES = ("AutoConfig", "AutoModel")


@dataclasses.dataclass(frozen=True)
class HfModelInfo:
    """What a ``config.json`` says besides the Halyard config.

    Attributes:
        family: the Halyard family (``"llama"``...).
        vocab_size: the checkpoint's embedding rows (before any padding for a mesh).
        bos_token_id, eos_token_id, pad_token_id: the special ids as the config states them (None when it
            does not; ``eos_token_id`` may be a list, e.g. Llama 3.1 Instruct's three end tokens).
        eos_token_ids: every EOS id, in order (also kept in the model config as ``eos_token_ids``).
        ignored_keys: the keys the family's rule ignored (not read by transformers for this architecture).
        stored_dtype: the dtype the config says the weights are stored in (``dtype``, or ``torch_dtype`` in
            older files; ``"bfloat16"``...), None when it names none.
    """

    family: str
    vocab_size: int
    bos_token_id: Any = None
    eos_token_id: Any = None
    pad_token_id: Any = None
    eos_token_ids: tuple[int, ...] = ()
    ignored_keys: tuple[str, ...] = ()
    stored_dtype: str | None = None


def _refuse_remote_code(hf: Mapping[str, Any], where: str) -> None:
    auto_map = hf.get("auto_map") or {}
    code = sorted(name for name in auto_map if str(name).startswith(_MODEL_CODE_ENTRIES))
    if code:
        raise UnsupportedModelError(
            f"{where} has 'auto_map' entries {code}: the model needs its own Python code "
            "(trust_remote_code). Halyard never runs code from a checkpoint; convert it to a supported "
            f"architecture ({', '.join(spec.architecture for spec in hf_families().values())}) first, or, "
            "where transformers' own class for this model_type computes the checkpoint (it loads it without "
            "trust_remote_code), delete the auto_map entries from config.json"
        )


def _supported() -> str:
    return ", ".join(sorted(f"{spec.model_type} ({spec.architecture})" for spec in hf_families().values()))


def detect_family(hf: Mapping[str, Any], where: str) -> HfFamily:
    """The spec of the family a ``config.json`` describes, from ``model_type`` (or, in files from before
    ``model_type`` existed, the single ``architectures`` entry).

    Raises:
        UnsupportedModelError: a model type Halyard does not implement (named), remote code, or an
            architecture other than the causal-LM head of that type.
    """
    specs = list(hf_families().values())
    model_type = hf.get("model_type")
    architectures = hf.get("architectures")
    if model_type is None:
        single = architectures[0] if architectures and len(architectures) == 1 else None
        spec = next((s for s in specs if s.architecture == single), None)
        if spec is None:
            raise UnsupportedModelError(
                f"{where} has no model_type and architectures {architectures}: Halyard cannot tell the "
                f"family; it imports {_supported()}"
            )
    else:
        spec = next((s for s in specs if s.model_type == str(model_type)), None)
        if spec is None:
            raise UnsupportedModelError(
                f"{where}: model_type {model_type!r} (architectures {architectures}) is a model family "
                f"Halyard does not implement; Halyard imports {_supported()}"
            )
    _refuse_remote_code(hf, where)
    if list(architectures or [spec.architecture]) != [spec.architecture]:
        raise UnsupportedModelError(
            f"{where}: architectures {architectures} are not supported for model_type "
            f"{spec.model_type!r}; Halyard imports the causal language model {spec.architecture!r} only"
        )
    return spec


def _resolve_aliases(hf: Mapping[str, Any], rule: KeyRule) -> dict[str, Any]:
    """``hf`` with transformers' other spellings (``attribute_map``, e.g. GPT-2's ``hidden_size``) renamed."""
    resolved = dict(hf)
    for alias, key in rule.aliases.items():
        if alias not in resolved:
            continue
        value = resolved.pop(alias)
        if key in resolved and resolved[key] != value:
            raise UnsupportedModelError(
                f"{alias}={value!r} and {key}={resolved[key]!r} disagree; transformers reads {alias} as {key}"
            )
        resolved[key] = value
    return resolved


def eos_ids(value: Any, where: str) -> tuple[int, ...]:
    """``eos_token_id`` (None, an int or a list of ints) as a tuple of ids.

    Raises:
        UnsupportedModelError: anything else (named).
    """
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise UnsupportedModelError(f"{where}: eos_token_id={value!r} must be an id or a list of ids")
    return tuple(dict.fromkeys(values))


def config_from_hf_dict(
    hf: Mapping[str, Any],
    *,
    where: str = "config.json",
    overrides: Mapping[str, Any] | None = None,
    strict: bool = False,
) -> tuple[ModelConfig, HfModelInfo]:
    """The Halyard config and the special ids described by a parsed ``config.json``.

    Args:
        hf: the parsed ``config.json``.
        where: how to name the file in messages.
        overrides: Halyard config fields to set on top (``param_dtype``, ``remat``, ...).
        strict: refuse every key the family's rule does not name, also those transformers does not read.

    Raises:
        UnsupportedModelError: a family Halyard does not implement, remote code, a quantized checkpoint,
            a key whose value Halyard does not implement, a missing required key, or a value Halyard's
            config rejects (each message names the family, key or quantization).
        TypeError: an unknown field in ``overrides`` (with a suggestion).
    """
    spec = detect_family(hf, where)
    quantized = quantization_refusal(hf, where)
    if quantized is not None:
        raise quantized
    rule = spec.rule
    try:
        hf = _resolve_aliases(hf, rule)
        missing = [key for key in spec.required if hf.get(key) is None]
        if missing:
            raise UnsupportedModelError(
                f"the required key(s) {missing} are missing; they fix the shapes of the weights"
            )
        ignored = rule.check(hf, strict=strict)
        used: set[str] = set()
        eos_token_ids = eos_ids(hf.get("eos_token_id"), where)
        config = spec.config(hf, used=used, eos_token_ids=eos_token_ids)
        assert used <= rule.implemented, (
            f"{spec.family} reader uses keys outside its rule: {used - rule.implemented}"
        )
    except UnsupportedModelError as error:
        raise UnsupportedModelError(f"{where}: {error}") from None
    except (TypeError, ValueError) as error:
        raise UnsupportedModelError(f"{where}: {error}") from error
    if ignored:
        logger.debug(
            "%s: ignored keys (transformers does not read them for %s): %s", where, spec.family, ignored
        )
    if overrides:
        config = config.replace(**overrides)  # an unknown field is a TypeError with a suggestion
    info = HfModelInfo(
        family=spec.family,
        vocab_size=int(hf["vocab_size"]),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
        eos_token_ids=eos_token_ids,
        ignored_keys=tuple(ignored),
        stored_dtype=_stored_dtype(hf),
    )
    return config, info


def _stored_dtype(hf: Mapping[str, Any]) -> str | None:
    """``dtype`` (transformers 4.56 and later) or ``torch_dtype``, as a plain name (``"torch.bfloat16"`` ->
    ``"bfloat16"``); None when neither is a string."""
    value = hf.get("dtype") or hf.get("torch_dtype")
    return value.removeprefix("torch.") if isinstance(value, str) else None
