"""Halyard model configs -> ``config.json`` / ``generation_config.json`` for `transformers`.

The family's Hugging Face spec (`halyard.models.hf.HfFamily`) writes the architecture's keys; this adds what
every architecture shares (``architectures``, ``model_type``, the special ids, the dtype). Keys use the
spelling every `transformers` release since 4.45 reads (``rope_theta`` + ``rope_scaling``, ``head_dim``); a
Halyard option the target architecture cannot express is an error, never dropped.
"""

from __future__ import annotations

from typing import Any

from halyard.models import ModelConfig
from halyard.models.hf import hf_family


def config_to_hf_dict(
    config: ModelConfig,
    *,
    vocab_size: int,
    dtype: str,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of a Halyard config.

    Args:
        config: a config of a family with a Hugging Face spec (`halyard.models.hf.hf_families`).
        vocab_size: embedding rows written (the model's size minus any padding).
        dtype: ``"float32"`` or ``"bfloat16"``: the weights' dtype, recorded in the config.
        bos_token_id, eos_token_id, pad_token_id: special ids (None: unknown; ``eos_token_id`` may be a
            list of ids).

    Raises:
        UnsupportedModelError: the family has no Hugging Face architecture or an option that it cannot
            express (named, with the family to use instead).
    """
    spec = hf_family(config)
    body = spec.write(config)
    body["vocab_size"] = vocab_size
    return {
        "architectures": [spec.architecture],
        "model_type": spec.model_type,
        **body,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "dtype": dtype,
        "use_cache": True,
    }


def generation_config_dict(
    bos_token_id: int | None, eos_token_id: int | list[int] | None, pad_token_id: int | None
) -> dict[str, Any]:
    """``generation_config.json``: the special ids `generate` needs (unknown ones are left out; every
    EOS id, so `generate` stops at each)."""
    ids = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    return {"_from_model_config": True, **{key: value for key, value in ids.items() if value is not None}}
