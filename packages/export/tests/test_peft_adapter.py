"""LoRA adapters exported for PEFT: ``PeftModel.from_pretrained(base, adapter)`` on the base `export_hf`
writes computes the Halyard LoRA model's logits, and so does the merged model exported alone."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import peft
import pytest
import transformers
from float_tolerance import referee_terms, summation_tolerance
from hf_cases import VOCAB, assert_logits_close, halyard_logits, padded_batch, torch_logits

from halyard.export import UnsupportedModelError, export_hf, export_peft_adapter
from halyard.models import CausalLM, model_config
from halyard.models.lora import (
    TARGET_MODULES,
    LoraAdapter,
    LoraConfig,
    add_lora,
    lora_params,
    merge_lora,
    with_lora,
)
from halyard.named import NamedArray

RANK = 4


def lora_tolerance(lora: CausalLM, logits: np.ndarray) -> float:
    """`referee_tolerance` of a LoRA model: every adapted projection (all 7 of a layer) adds its adapter's two
    products (the input's width, the rank) and a sum, or a merged weight's rounding."""
    config = lora.model_config
    adapted = (
        config.shape.layers * len(TARGET_MODULES) * (max(config.shape.embed, config.shape.mlp) + RANK + 2)
    )
    return summation_tolerance(logits, referee_terms(config, logits.shape[1]) + adapted)


def _lora_model(family: str, targets: tuple[str, ...], **shape: object) -> tuple[CausalLM, CausalLM]:
    """A tiny base model and the same model with adapters whose B is random (nonzero)."""
    config = model_config(
        family, vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, max_position=64,
        initializer_range=0.2, **shape,
    )  # fmt: skip
    base = config.init(jax.random.key(0))
    adapters = lora_params(
        add_lora(base, LoraConfig(rank=RANK, alpha=6.0, target_modules=targets), key=jax.random.key(1))
    )
    keys = iter(jax.random.split(jax.random.key(2), len(adapters)))
    random_b = {
        name: LoraAdapter(a.lora_a, NamedArray(0.3 * jax.random.normal(next(keys), a.lora_b.array.shape), a.lora_b.axes), a.alpha)
        for name, a in adapters.items()
    }  # fmt: skip
    return base, with_lora(base, random_b)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[CausalLM, Path, Path]:
    base, lora = _lora_model(
        "llama", tuple(TARGET_MODULES), intermediate_size=48, num_kv_heads=2, tie_embeddings=False
    )
    folder = tmp_path_factory.mktemp("peft")
    export_hf(base, folder / "base")
    export_peft_adapter(lora, folder / "adapter", base_model=str(folder / "base"))
    return lora, folder / "base", folder / "adapter"


def test_peft_loads_the_adapter_onto_the_base_with_equal_logits(llama: tuple[CausalLM, Path, Path]) -> None:
    lora, base_folder, adapter_folder = llama
    base = transformers.AutoModelForCausalLM.from_pretrained(base_folder, attn_implementation="eager")
    model = peft.PeftModel.from_pretrained(base, adapter_folder).eval()
    ids, attention_mask = padded_batch()
    expected = halyard_logits(lora, ids, attention_mask)
    atol = lora_tolerance(lora, expected)
    assert_logits_close(expected, torch_logits(model, ids, attention_mask), attention_mask, atol=atol)
    # the adapters matter: the base alone is far from the LoRA model
    plain = torch_logits(transformers.AutoModelForCausalLM.from_pretrained(base_folder), ids, attention_mask)
    assert np.abs(plain - expected).max() > 0.1


def test_the_adapter_folder_holds_peft_names_and_shapes(llama: tuple[CausalLM, Path, Path]) -> None:
    from safetensors.numpy import load_file

    _, _, adapter_folder = llama
    config = json.loads((adapter_folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 6, "LORA")
    assert config["target_modules"] == sorted(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    )
    tensors = load_file(str(adapter_folder / "adapter_model.safetensors"))
    assert tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"].shape == (4, 32)
    assert tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"].shape == (
        16,
        4,
    )  # 2 kv heads of 8
    assert tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"].shape == (4, 48)
    assert len(tensors) == 2 * 7 * 2


def test_the_merged_export_computes_the_lora_model(
    llama: tuple[CausalLM, Path, Path], tmp_path: Path
) -> None:
    lora, _, _ = llama
    export_hf(merge_lora(lora), tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "merged", attn_implementation="eager"
    )
    ids, attention_mask = padded_batch()
    expected = halyard_logits(lora, ids, attention_mask)
    actual = torch_logits(merged.eval(), ids, attention_mask)
    assert_logits_close(expected, actual, attention_mask, atol=lora_tolerance(lora, expected))


def test_a_fused_hugging_face_weight_is_refused_naming_the_merge() -> None:
    _, lora = _lora_model("gpt2", ("q_proj", "up_proj"))
    with pytest.raises(UnsupportedModelError, match="q_proj adapter of a gpt2 model.*--lora merge"):
        export_peft_adapter(lora, "/nonexistent/never-written")


def test_a_model_without_adapters_is_refused(tmp_path: Path) -> None:
    base, _ = _lora_model("llama", ("q_proj",), intermediate_size=48, num_kv_heads=2)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        export_peft_adapter(base, tmp_path)
