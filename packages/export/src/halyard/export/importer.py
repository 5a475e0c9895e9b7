"""`import_hf`: a Hugging Face model folder -> a Halyard model, optionally straight into a sharded layout."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from halyard.export.config_reading import HfModelInfo, config_from_hf_dict, eos_ids
from halyard.export.errors import (
    MissingHfFileError,
    MissingWeightError,
    ShapeMismatchError,
    UnexpectedWeightError,
)
from halyard.export.plan import LeafPlan, expected_tensors, leaf_plans, named_leaves
from halyard.export.sources import WeightSource, open_weights
from halyard.models import CausalLM, ModelConfig
from halyard.models.hf import HfFamily, hf_family
from halyard.named import NamedArray
from halyard.shard import Layout, pad_for

GENERATION_CONFIG = "generation_config.json"


def read_hf_config(
    folder: str | Path, *, overrides: Mapping[str, Any] | None = None, strict: bool = False
) -> tuple[ModelConfig, HfModelInfo]:
    """The Halyard config of a Hugging Face folder's ``config.json`` (no weights are read).

    The EOS ids are those of ``config.json`` followed by any other ``eos_token_id`` of
    ``generation_config.json`` (what `transformers`' ``generate`` stops at).

    Args:
        folder: the model folder.
        overrides: Halyard config fields set on top (``param_dtype``, ``remat``, ``attention_implementation``).
        strict: refuse every key the family's rule does not name (default: keys transformers does not read
            for the architecture are ignored; see `halyard.models.hf.key_rule`).

    Returns:
        ``(config, info)``; ``info`` holds the family, the checkpoint's vocabulary size and its special ids.

    Raises:
        MissingHfFileError: no ``config.json`` in ``folder``.
        UnsupportedModelError: remote code, a quantized checkpoint, an unsupported family or a value
            Halyard does not implement (named).
    """
    path = Path(folder) / "config.json"
    if not path.exists():
        raise MissingHfFileError(
            f"{path} does not exist: a Hugging Face model folder needs its config.json next to the weights; "
            "give the folder that save_pretrained wrote (config.json and *.safetensors)"
        )
    config, info = config_from_hf_dict(
        json.loads(path.read_text()), where=str(path), overrides=overrides, strict=strict
    )
    generation = Path(folder) / GENERATION_CONFIG
    if generation.is_file():
        more = eos_ids(json.loads(generation.read_text()).get("eos_token_id"), str(generation))
        ids = tuple(dict.fromkeys(info.eos_token_ids + more))
        if ids != info.eos_token_ids:
            config = config.replace(eos_token_ids=ids)
            info = dataclasses.replace(info, eos_token_ids=ids)
    return config, info


def _check_tensors(source: WeightSource, plans: list[LeafPlan], config: ModelConfig, spec: HfFamily) -> None:
    expected = expected_tensors(plans)
    present = set(source.keys())
    missing = [key for key in expected if key not in present]
    if missing:
        shown = ", ".join(f"{key!r} (shape {expected[key]})" for key in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise MissingWeightError(
            f"{source.description} lacks {len(missing)} tensor(s) that {type(config).__name__} needs: "
            f"{shown}{more}. The checkpoint and its config.json disagree (or the files are incomplete)"
        )
    for key, shape in expected.items():
        found = source.shape(key)
        if found != shape:
            raise ShapeMismatchError(
                f"{source.file_of(key)}: tensor {key!r} has shape {found}, but config.json implies {shape}; "
                "the weights do not belong to this config"
            )
    unexpected = []
    for key in source.keys():  # noqa: SIM118 (a WeightSource is not a mapping)
        if key in expected or spec.is_buffer(key):
            continue
        if key == spec.head_key:  # not expected: the embeddings are tied
            _check_tied_head(source, plans, key)
            continue
        unexpected.append(key)
    if unexpected:
        shown = ", ".join(f"{key!r} (shape {source.shape(key)})" for key in unexpected[:6])
        more = f" and {len(unexpected) - 6} more" if len(unexpected) > 6 else ""
        raise UnexpectedWeightError(
            f"{source.description} holds {len(unexpected)} tensor(s) that {type(config).__name__} has no "
            f"place for: {shown}{more}. Nothing is dropped silently: check config.json (e.g. "
            "tie_word_embeddings, attention_bias) against the weights"
        )


def _check_tied_head(source: WeightSource, plans: list[LeafPlan], head: str) -> None:
    """A stored output projection ``head`` of a tied model must equal the embedding it is tied to."""
    embedding = next(p.mapping.hf_key for p in plans if p.path == "embed.weight")
    full = (slice(None), slice(None))
    if source.shape(head) != source.shape(embedding) or not np.array_equal(
        source.read(head, full), source.read(embedding, full)
    ):
        raise UnexpectedWeightError(
            f"{source.description} holds {head!r} different from {embedding!r}, but config.json ties "
            "them (tie_word_embeddings); set tie_word_embeddings=false if the head is separate"
        )


def _block_reader(
    plan: LeafPlan, source: WeightSource, dtype: Any
) -> Callable[[tuple[slice, ...] | None], np.ndarray]:
    """Reads any rectangular block of the Halyard array (padding rows of the vocabulary are zeros)."""
    mapping, leaf = plan.mapping, plan.leaf
    num_stacked = len(mapping.stacked)
    last: dict[tuple, np.ndarray] = {}

    def read_one(indices: dict[str, int], target_slices: list[slice]) -> np.ndarray:
        key = mapping.key(indices)
        reader = lambda slices: source.read(key, slices)
        return mapping.read(reader, plan.hf_sizes, target_slices).astype(dtype, copy=False)

    def read(index: tuple[slice, ...] | None) -> np.ndarray:
        index = index if index is not None else tuple(slice(None) for _ in leaf.axes)
        bounds = tuple(s.indices(axis.size)[:2] for s, axis in zip(index, leaf.axes))
        if bounds in last:  # replicated leaves ask for the same block once per device
            return last[bounds]
        stacked, rest = bounds[:num_stacked], list(bounds[num_stacked:])
        pad_widths = [(0, 0)] * len(bounds)
        for position, (name, (start, stop)) in enumerate(zip(mapping.target, rest)):
            limit = plan.hf_sizes[name]
            if stop > limit:  # vocabulary padding beyond the checkpoint's rows
                pad_widths[num_stacked + position] = (0, stop - max(start, limit))
                rest[position] = (min(start, limit), limit)
        target_slices = [slice(start, stop) for start, stop in rest]
        empty = any(stop <= start for start, stop in rest)
        block_shape = [stop - start for start, stop in (*stacked, *rest)]
        if empty:
            block = np.zeros(block_shape, dtype)
        else:
            ranges = [range(start, stop) for start, stop in stacked]
            block = _stack(ranges, mapping.stacked, {}, lambda ind: read_one(ind, target_slices))
        block = np.pad(block, pad_widths) if any(w != (0, 0) for w in pad_widths) else block
        last.clear()
        last[bounds] = block
        return block

    return read


def _stack(
    ranges: list[range],
    names: list[str],
    chosen: dict[str, int],
    read_one: Callable[[dict[str, int]], np.ndarray],
) -> np.ndarray:
    if not ranges:
        return read_one(chosen)
    return np.stack([_stack(ranges[1:], names[1:], {**chosen, names[0]: i}, read_one) for i in ranges[0]])


def _vocab_for_mesh(config: ModelConfig, vocab_size: int, layout: Layout, mesh: jax.sharding.Mesh) -> int:
    """``pad_for(vocab_size)`` when the layout really splits a vocabulary dimension, else ``vocab_size``
    (under FSDP the embedding's ``embed`` dimension usually takes the mesh axis; padding would only add
    zero logits)."""
    padded = pad_for(vocab_size, "vocab", mesh, layout)
    if padded == vocab_size:
        return vocab_size
    abstract = eqx.filter_eval_shape(config.replace(vocab_size=padded).init, jax.random.key(0))
    for _, leaf in named_leaves(abstract)[0]:
        if leaf.has_axis("vocab"):
            spec = layout.partition_spec(leaf, mesh, weight=True)
            if spec[leaf.axis_names.index("vocab")] is not None:
                return padded
    return vocab_size


def import_hf(
    folder: str | Path,
    *,
    layout: Layout | None = None,
    mesh: jax.sharding.Mesh | None = None,
    dtype: str | None = None,
    allow_pickle: bool = False,
    config_overrides: Mapping[str, Any] | None = None,
    strict: bool = False,
) -> tuple[ModelConfig, CausalLM]:
    """Load a Hugging Face causal-LM folder of any family with a Hugging Face spec
    (`halyard.models.hf.hf_families`: GPT-2, Llama, Mistral, Qwen2, Mixtral, ...) as a Halyard model.

    Without ``layout``/``mesh`` the parameters are ordinary arrays on the default device: every tensor is
    read into host memory first (`read_hf_to_host`), then all are put on the device in one ``jax.device_put``.
    With both, each parameter is created directly in ``layout``'s sharding: every device's block is read from
    the memory-mapped file on its own (``jax.make_array_from_callback``), so the host never holds more than
    one tensor's block at a time. When the layout splits a ``vocab`` dimension that the mesh does not
    divide, the vocabulary is padded with zero rows up to ``halyard.shard.pad_for(vocab, "vocab", mesh,
    layout)``: the returned config then has the padded ``vocab_size`` (the padded ids get logit 0; they
    never occur as labels), and `export_hf` cuts the rows back (``vocab_size=`` or the tokenizer's size).

    Args:
        folder: a folder with ``config.json`` and ``model.safetensors`` or sharded safetensors with
            ``model.safetensors.index.json`` (or ``pytorch_model.bin`` with ``allow_pickle``).
        layout: where each parameter goes (needs ``mesh``).
        mesh: the device mesh (needs ``layout``).
        dtype: parameter dtype (``"float32"``, ``"bfloat16"``...); None keeps the config's ``param_dtype``
            (float32 unless ``config_overrides`` says otherwise). Stored tensors are converted.
        allow_pickle: read pickled ``pytorch_model.bin`` weights when there are no safetensors, with
            ``torch.load(weights_only=True)``.
        config_overrides: Halyard config fields set on top of ``config.json`` (``remat``, ``scan_layers``,
            ``attention_implementation``, ...).
        strict: refuse every ``config.json`` key the family's rule does not name (see `read_hf_config`).

    Returns:
        ``(config, model)``.

    Raises:
        FileNotFoundError: no ``config.json`` or no weights.
        UnsupportedModelError: remote code, a quantized checkpoint, a family or a value Halyard does not
            implement.
        PickleRefusedError: only pickled weights and ``allow_pickle`` is False.
        MissingWeightError / UnexpectedWeightError / ShapeMismatchError: the weights and the config
            disagree (the message names the tensor, its file and both shapes).
        ValueError: only one of ``layout`` and ``mesh`` given.
    """
    if (layout is None) != (mesh is None):
        raise ValueError("import_hf needs both layout and mesh to shard the model (or neither)")
    if layout is None or mesh is None:
        config, host_model = read_hf_to_host(
            folder, dtype=dtype, allow_pickle=allow_pickle, config_overrides=config_overrides, strict=strict
        )
        # device_put, not jnp.asarray: that compiles a small program for each shape and dtype
        return config, jax.device_put(host_model)
    reading = _plan_reading(folder, dtype, allow_pickle, config_overrides, strict, sharding=(layout, mesh))
    shardings = dict(named_leaves(layout.shardings(reading.abstract, mesh))[0])
    new_leaves = []
    for (path, leaf), plan in zip(named_leaves(reading.abstract)[0], reading.plans):
        read = _block_reader(plan, reading.source, reading.numpy_dtype)
        shape = tuple(axis.size for axis in leaf.axes)
        array = jax.make_array_from_callback(shape, shardings[path].array, read)
        new_leaves.append(NamedArray(array, leaf.axes))
    return reading.config, jax.tree_util.tree_unflatten(reading.treedef, new_leaves)


def read_hf_to_host(
    folder: str | Path,
    *,
    dtype: str | None = None,
    allow_pickle: bool = False,
    config_overrides: Mapping[str, Any] | None = None,
    strict: bool = False,
) -> tuple[ModelConfig, CausalLM]:
    """A Hugging Face folder's model with numpy arrays (host memory) as its parameters: `import_hf` without
    a device. Nothing here starts JAX's backend, so the accelerator's runtime can start in another thread
    meanwhile (``halyard serve`` does); ``jax.device_put(model)`` then puts every parameter on the device.

    Args:
        folder, dtype, allow_pickle, config_overrides, strict: as `import_hf`'s.

    Returns:
        ``(config, model)``; the model's arrays are numpy arrays of ``config.param_dtype``.

    Raises:
        As `import_hf`.
    """
    reading = _plan_reading(folder, dtype, allow_pickle, config_overrides, strict, sharding=None)
    new_leaves = []
    for (_, leaf), plan in zip(named_leaves(reading.abstract)[0], reading.plans):
        array = _block_reader(plan, reading.source, reading.numpy_dtype)(None)
        new_leaves.append(NamedArray(array, leaf.axes))
    return reading.config, jax.tree_util.tree_unflatten(reading.treedef, new_leaves)


@dataclasses.dataclass(frozen=True)
class _Reading:
    """What reading a folder's weights needs: its config, its tensors, each parameter's plan."""

    config: ModelConfig
    source: WeightSource
    abstract: CausalLM
    treedef: Any
    plans: list[LeafPlan]
    numpy_dtype: np.dtype


def _plan_reading(
    folder: str | Path,
    dtype: str | None,
    allow_pickle: bool,
    config_overrides: Mapping[str, Any] | None,
    strict: bool,
    sharding: tuple[Layout, jax.sharding.Mesh] | None,
) -> _Reading:
    """The config, the weights' source and every parameter's plan, the tensors checked against them (no
    tensor is read; with ``sharding`` None no JAX backend is started either)."""
    folder = Path(folder)
    overrides = dict(config_overrides or {})
    if dtype is not None:
        overrides["param_dtype"] = dtype
    config, info = read_hf_config(folder, overrides=overrides, strict=strict)
    source = open_weights(folder, allow_pickle=allow_pickle)
    if sharding is not None:
        vocab_size = _vocab_for_mesh(config, info.vocab_size, *sharding)
        if vocab_size != config.vocab_size:  # type: ignore[attr-defined]
            config = config.replace(vocab_size=vocab_size)
    # The key is made inside the trace: a concrete key would start JAX's backend.
    abstract = eqx.filter_eval_shape(lambda: config.init(jax.random.key(0)))
    spec = hf_family(config)
    mappings = spec.checkpoint_mappings(config, set(source.keys()))
    plans = leaf_plans(abstract, mappings, info.vocab_size)
    _check_tensors(source, plans, config, spec)
    treedef = named_leaves(abstract)[1]
    numpy_dtype = np.dtype(jnp.dtype(config.param_dtype))
    return _Reading(config, source, abstract, treedef, plans, numpy_dtype)
