"""`export_peft_adapter`: a LoRA model's adapters as a PEFT adapter folder (adapter_config.json and
adapter_model.safetensors) that ``peft.PeftModel.from_pretrained(base, folder)`` loads onto the base
model `export_hf` writes.

PEFT names each tensor after the base layer it adapts, ``base_model.model.<layer>.lora_A.weight`` of
shape ``[rank, in]`` and ``lora_B.weight`` of shape ``[out, rank]``; the names and the layout of ``in``
and ``out`` come from the family's own mapping of the base weight (`halyard.models.hf.HfFamily`), so an
adapter is exportable wherever that weight is one plain ``[out, in]`` Hugging Face linear layer.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax

from halyard.export.exporter import EXPORT_DTYPES
from halyard.export.plan import leaf_plans
from halyard.export.safetensors_writing import write_safetensors
from halyard.export.tensor_gathering import Contribution, gather_tensor
from halyard.models import CausalLM
from halyard.models.hf import TensorMapping, UnsupportedModelError, hf_family
from halyard.models.lora import RANK, LoraAdapter, lora_params, module_path

PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _group_text(groups: list[list[str]]) -> str:
    return " ".join(group[0] if len(group) == 1 else f"({' '.join(group)})" for group in groups)


def adapter_mappings(model: CausalLM, adapters: dict[str, LoraAdapter]) -> list[TensorMapping]:
    """The `TensorMapping` of each adapter's A and B (paths ``q_proj.lora_a``...) in PEFT's names.

    Raises:
        UnsupportedModelError: the family has no Hugging Face spec, or a targeted weight is not one plain
            ``[out, in]`` tensor there (GPT-2's fused ``c_attn``, Phi-3's ``qkv_proj``): export it merged.
    """
    config = model.model_config
    base = {mapping.path: mapping for mapping in hf_family(config).mappings(config)}
    result = []
    for name, adapter in adapters.items():
        mapping = base.get(module_path(name) + ".weight")
        stacked = len(adapter.stacked_axes)
        inputs = [axis.name for axis in adapter.lora_a.axes[stacked:-1]]
        outputs = [axis.name for axis in adapter.lora_b.axes[stacked + 1 :]]
        groups = mapping.groups if mapping is not None else []
        split = next((i for i in range(len(groups) + 1) if sum(map(len, groups[:i])) == len(outputs)), None)
        plain = (
            mapping is not None
            and mapping.part is None
            and mapping.hf_key.endswith(".weight")
            and split is not None
            and sorted(n for g in groups[:split] for n in g) == sorted(outputs)
            and sorted(n for g in groups[split:] for n in g) == sorted(inputs)
        )
        if not plain or mapping is None or split is None:
            raise UnsupportedModelError(
                f"the {name} adapter of a {config.family} model has no PEFT counterpart: its Hugging Face "
                "weight is not one [out, in] linear layer; export the merged model instead (--lora merge)"
            )
        stem = PEFT_PREFIX + mapping.hf_key.removesuffix(".weight")
        out_text, in_text = _group_text(groups[:split]), _group_text(groups[split:])
        result += [
            TensorMapping(f"{name}.lora_a", f"{stem}.lora_A.weight", f"{RANK} {in_text} -> {' '.join(inputs)} {RANK}"),
            TensorMapping(f"{name}.lora_b", f"{stem}.lora_B.weight", f"{out_text} {RANK} -> {RANK} {' '.join(outputs)}"),
        ]  # fmt: skip
    return result


def peft_module_names(model: CausalLM, adapters: dict[str, LoraAdapter]) -> list[str]:
    """The Hugging Face module names PEFT's ``target_modules`` lists (``q_proj``, ``down_proj``...)."""
    return sorted({m.hf_key.split(".")[-3] for m in adapter_mappings(model, adapters)})


def export_peft_adapter(
    model: CausalLM,
    folder: str | Path,
    *,
    base_model: str | None = None,
    dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Write the adapters of a LoRA model (`halyard.models.lora`) as a PEFT adapter folder.

    Args:
        model: a model with `LoraLinear` layers (sharded or not); every process must call this across
            several processes (they take part in the gathers) and only process 0 writes.
        folder: where to write (created; must not hold an adapter already unless ``overwrite``).
        base_model: ``base_model_name_or_path`` recorded in adapter_config.json (the base's folder or hub id).
        dtype: ``"float32"`` or ``"bfloat16"`` for the stored tensors.
        overwrite: replace an adapter already in ``folder``.

    Returns:
        The folder.

    Raises:
        ValueError: ``model`` has no adapters, or an unknown ``dtype``.
        UnsupportedModelError: see `adapter_mappings`.
        FileExistsError: ``folder`` holds an adapter and ``overwrite`` is False.
    """
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not supported; choose one of {', '.join(EXPORT_DTYPES)}")
    adapters = {name: _without_dropout_key(a) for name, a in lora_params(model).items()}
    if not adapters:
        raise ValueError(
            "the model has no LoRA adapters to export (lora.rank was 0): export it with export_hf"
        )
    mappings = adapter_mappings(model, adapters)
    folder = Path(folder)
    if (folder / ADAPTER_CONFIG).exists() and not overwrite:
        raise FileExistsError(
            f"{folder} already holds an adapter; choose an empty folder or pass overwrite=True"
        )
    plans = leaf_plans(adapters, mappings, int(model.model_config.vocab_size))
    contributions: dict[str, list[Contribution]] = defaultdict(list)
    for plan in plans:
        for indices in plan.stacked_indices():
            contributions[plan.mapping.key(indices)].append((plan, indices))
    export_dtype = EXPORT_DTYPES[dtype]
    writer = jax.process_index() == 0
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(
        folder / ADAPTER_WEIGHTS if writer else None,
        {key: parts[0][0].hf_shape() for key, parts in contributions.items()},
        export_dtype,
        lambda key: gather_tensor(contributions[key], export_dtype),
        metadata={"format": "pt"},
    )
    if writer:
        config = peft_config(model, adapters, base_model)
        (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


def peft_config(model: CausalLM, adapters: dict[str, LoraAdapter], base_model: str | None) -> dict[str, Any]:
    """adapter_config.json for ``adapters`` (one rank, alpha and dropout for all, as Halyard trains them)."""
    first = next(iter(adapters.values()))
    alpha = int(first.alpha) if float(first.alpha).is_integer() else first.alpha
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": first.rank,
        "lora_alpha": alpha,
        "lora_dropout": first.dropout,
        "target_modules": peft_module_names(model, adapters),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
    }


def _without_dropout_key(adapter: LoraAdapter) -> LoraAdapter:
    return LoraAdapter(adapter.lora_a, adapter.lora_b, adapter.alpha, adapter.dropout)
