"""`export_hf`: a Halyard model -> a folder `transformers.AutoModelForCausalLM.from_pretrained` loads."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from halyard.export.config_writing import config_to_hf_dict, generation_config_dict
from halyard.export.plan import leaf_plans
from halyard.export.safetensors_writing import write_safetensors
from halyard.export.sources import SAFETENSORS, SAFETENSORS_INDEX
from halyard.export.tensor_gathering import Contribution, gather_tensor
from halyard.export.tokenizer_files import TokenizerInfo, read_tokenizer, write_tokenizer_files
from halyard.models import CausalLM
from halyard.models.hf import hf_family

EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30


def _shards(sizes: dict[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names grouped in order into files of at most ``max_shard_bytes`` (a larger tensor alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for key, size in sizes.items():
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(key)
        used += size
    return shards


def _special_ids(
    tokenizer: TokenizerInfo | None, explicit: dict[str, Any], model_eos: tuple[int, ...], vocab_size: int
) -> dict[str, Any]:
    """BOS/EOS/pad ids for the exported folder: explicit arguments, else (EOS) the model config's
    ``eos_token_ids`` (an imported checkpoint's, written back unchanged), else the tokenizer's."""
    ids: dict[str, Any] = {}
    for role, value in explicit.items():
        if value is None and role == "eos" and model_eos:
            value = list(model_eos)
        elif value is None and tokenizer is not None:
            value = tokenizer.special_id(role)
        values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
        for one in values:
            if not 0 <= one < vocab_size:
                raise ValueError(
                    f"{role}_token_id={one} is outside the exported vocabulary 0..{vocab_size - 1}"
                )
        # one id is written as an int, several as a list (how transformers writes Llama 3.1's)
        ids[role] = values[0] if len(values) == 1 else list(values) if values else None
    return ids


def _sync_processes(name: str) -> None:
    """Wait for every process (nothing to wait for in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _previous_export(folder: Path) -> list[Path]:
    if not folder.exists():
        return []
    return [p for p in folder.iterdir() if p.name == "config.json" or p.name.startswith("model")]


def _check_previous_export(folder: Path, overwrite: bool) -> None:
    previous = _previous_export(folder)
    if previous and not overwrite:
        raise FileExistsError(
            f"{folder} already holds a model ({', '.join(sorted(p.name for p in previous))}); choose an empty "
            "folder or pass overwrite=True"
        )


def _clear_previous_export(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for path in _previous_export(folder):
        if path.name.endswith(".safetensors") or path.name == SAFETENSORS_INDEX:
            path.unlink()


def export_hf(
    model: CausalLM,
    folder: str | Path,
    *,
    tokenizer: str | Path | None = None,
    dtype: str = "float32",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    vocab_size: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` as a Hugging Face folder: config.json, generation_config.json, safetensors, tokenizer.

    Args:
        model: a Halyard model of a family with a Hugging Face spec (GPT-2, Llama, ...), sharded or not. Each safetensors file is
            written tensor by tensor as each is gathered from the devices, so the host holds about one
            Hugging Face tensor at a time. Across several processes, every process must call this (they
            all take part in the gathers) and only process 0 writes.
        folder: where to write (created; must not already hold a model unless ``overwrite``).
        tokenizer: ``tokenizer.json`` or a folder with one (plus ``tokenizer_config.json``...): copied
            alongside, and its BOS/EOS/pad tokens become the config's ids unless given explicitly.
        dtype: ``"float32"`` or ``"bfloat16"`` for the stored weights.
        max_shard_bytes: above this total size the weights are split into ``model-0000i-of-0000n.safetensors``
            files with a ``model.safetensors.index.json``; one tensor is never split.
        vocab_size: embedding rows to write (drop vocabulary padding). Default: the tokenizer's vocabulary
            size when a tokenizer is given and it is smaller than the model's, else the model's.
        bos_token_id, eos_token_id, pad_token_id: special ids for config.json and generation_config.json
            (``eos_token_id`` may be a list). Unset: the tokenizer's, except EOS when the model config has
            ``eos_token_ids`` (every EOS of an imported checkpoint): those are written back unchanged.
        overwrite: replace an earlier export in ``folder``.

    Returns:
        The folder.

    Raises:
        UnsupportedModelError: a family or option with no Hugging Face equivalent (e.g. ``mup``).
        ValueError: unknown ``dtype``, a ``vocab_size`` outside ``1..model vocab`` or smaller than the
            tokenizer's, a special id outside the vocabulary.
        FileExistsError: ``folder`` holds a model and ``overwrite`` is False.
    """
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not supported; choose one of {', '.join(EXPORT_DTYPES)}")
    config = model.model_config
    mappings = hf_family(config).mappings(config)
    info = read_tokenizer(tokenizer) if tokenizer is not None else None
    model_vocab = int(config.vocab_size)
    if vocab_size is None:
        vocab_size = info.vocab_size if info is not None and info.vocab_size < model_vocab else model_vocab
    if not 1 <= vocab_size <= model_vocab:
        raise ValueError(f"vocab_size={vocab_size} must lie between 1 and the model's {model_vocab}")
    if info is not None and info.vocab_size > vocab_size:
        raise ValueError(
            f"the tokenizer {info.tokenizer_json} has {info.vocab_size} tokens but only {vocab_size} "
            "embedding rows would be written; pass a larger vocab_size or the model's own tokenizer"
        )
    explicit = {"bos": bos_token_id, "eos": eos_token_id, "pad": pad_token_id}
    ids = _special_ids(info, explicit, tuple(config.eos_token_ids), vocab_size)
    hf_config = config_to_hf_dict(
        config,
        vocab_size=vocab_size,
        dtype=dtype,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
    )
    folder = Path(folder)
    # Only process 0 writes; every process checks the folder first and then takes part in the gathers.
    writer = jax.process_index() == 0
    _check_previous_export(folder, overwrite)
    _sync_processes("halyard.export_hf: folder checked")
    if writer:
        _clear_previous_export(folder)

    plans = leaf_plans(model, mappings, vocab_size)
    contributions: dict[str, list[Contribution]] = defaultdict(list)
    for plan in plans:
        for indices in plan.stacked_indices():
            contributions[plan.mapping.key(indices)].append((plan, indices))
    export_dtype = EXPORT_DTYPES[dtype]
    shapes = {key: parts[0][0].hf_shape() for key, parts in contributions.items()}
    sizes = {key: math.prod(shape) * export_dtype.itemsize for key, shape in shapes.items()}
    shards = _shards(sizes, max_shard_bytes)
    names = (
        [SAFETENSORS]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map = {}
    for name, keys in zip(names, shards):
        # One tensor at a time: gathered, written, dropped (the file's header is known from the shapes).
        write_safetensors(
            folder / name if writer else None,
            {key: shapes[key] for key in keys},
            export_dtype,
            lambda key: gather_tensor(contributions[key], export_dtype),
            metadata={"format": "pt"},
        )
        weight_map.update(dict.fromkeys(keys, name))
    if writer:
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
            (folder / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (folder / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        generation = generation_config_dict(ids["bos"], ids["eos"], ids["pad"])
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if info is not None:
            max_length = int(getattr(config, "max_position", 0)) or int(1e30)
            write_tokenizer_files(info, folder, special_ids=ids, model_max_length=max_length)
    _sync_processes("halyard.export_hf: folder written")  # the folder is complete wherever this returns
    return folder
