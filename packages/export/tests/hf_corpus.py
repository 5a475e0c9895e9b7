"""The corpus of real ``config.json`` files (fixtures/hf-configs, provenance in its INDEX.json), and shrinking.

`shrink` keeps every key of a real config but makes the shapes tiny (2 layers, heads of 16 channels,
vocabulary 512) while keeping what decides the computation: the query/KV head ratio, an explicit
``head_dim`` and its ratio to ``hidden_size / num_attention_heads``, the rope type and its scaling, biases,
tied or untied embeddings, windows (made shorter than the test sequence so they matter),
``max_window_layers`` below, equal to or above the layer count, and longrope's factors (one per rotating
channel pair of the small heads, with a pre-training length the test sequence passes, so that the long
factors are the ones compared). ``initializer_range`` becomes 0.2 so that random-init logits are large
enough to compare (it only affects initialisation).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import transformers

from halyard.models.hf import hf_families

CORPUS = Path(__file__).parent / "fixtures" / "hf-configs"
# The families with a Hugging Face spec (INDEX.json's ``family`` is the model_type, which each spec states)
SUPPORTED = tuple(sorted(spec.model_type for spec in hf_families().values()))
# transformers' config class of each supported family
CONFIG_CLASSES = {model_type: transformers.CONFIG_MAPPING[model_type] for model_type in SUPPORTED}
VOCAB = 512
LAYERS = 2
HEAD_SIZE = 16
WINDOW = 4
LONGROPE_ORIGINAL = 8  # below the test batch's 12 positions
# auto_map entries that replace the model's code (an AutoTokenizer entry does not change the model)
MODEL_CODE = ("AutoConfig", "AutoModel")


def entries() -> list[dict[str, Any]]:
    """INDEX.json: one entry per file (``file``, ``checkpoint``, ``family``, ``kind``, ``source``, ``note``)."""
    return json.loads((CORPUS / "INDEX.json").read_text())


def load(entry: dict[str, Any]) -> dict[str, Any]:
    return json.loads((CORPUS / entry["file"]).read_text())


def is_quantized(hf: dict[str, Any]) -> bool:
    return bool(hf.get("quantization_config") or hf.get("quantization"))


def has_model_code(hf: dict[str, Any]) -> bool:
    """Whether ``auto_map`` names the checkpoint's own model code (which Halyard refuses)."""
    return any(str(name).startswith(MODEL_CODE) for name in hf.get("auto_map") or {})


def without_model_code(hf: dict[str, Any]) -> dict[str, Any]:
    """``hf`` with the ``auto_map`` entries of model code removed (what transformers runs by default)."""
    auto_map = {k: v for k, v in (hf.get("auto_map") or {}).items() if not str(k).startswith(MODEL_CODE)}
    return {
        **{k: v for k, v in hf.items() if k != "auto_map"},
        **({"auto_map": auto_map} if auto_map else {}),
    }


def accepted_entries() -> list[dict[str, Any]]:
    """The corpus files Halyard must import: a supported family, not quantized, without model code."""
    return [
        e
        for e in entries()
        if e["family"] in SUPPORTED and not is_quantized(load(e)) and not has_model_code(load(e))
    ]


def _token_id(value: Any) -> Any:
    if isinstance(value, list):
        return [v % VOCAB for v in value]
    return value % VOCAB if isinstance(value, int) else value


def _shrink_gpt2(hf: dict[str, Any]) -> None:
    hf.update(n_embd=4 * HEAD_SIZE, n_head=4, n_layer=LAYERS, n_positions=64)
    if "n_ctx" in hf:
        hf["n_ctx"] = 64
    if hf.get("n_inner") is not None:
        hf["n_inner"] = 3 * hf["n_embd"]


def _shrink_llama_like(hf: dict[str, Any]) -> None:
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    if kv_heads == heads:
        new_heads = new_kv = 4
    else:
        new_kv = 1 if kv_heads == 1 else 2
        new_heads = new_kv * (heads // kv_heads)
    default_head = hf["hidden_size"] // heads
    if hf.get("head_dim") is not None:
        # an even size (rotary rotates pairs): Qwen3-4B's 128 over a default of 80 becomes 24
        hf["head_dim"] = 2 * (HEAD_SIZE * hf["head_dim"] // (2 * default_head))
    layers = hf["num_hidden_layers"]
    hf.update(
        hidden_size=new_heads * HEAD_SIZE,
        num_attention_heads=new_heads,
        intermediate_size=8 * HEAD_SIZE,
        num_hidden_layers=LAYERS,
    )
    if "num_key_value_heads" in hf:
        hf["num_key_value_heads"] = new_kv
    if hf.get("sliding_window") is not None:
        hf["sliding_window"] = WINDOW
    if "max_window_layers" in hf:
        below = hf["max_window_layers"]
        hf["max_window_layers"] = below - layers + LAYERS if below >= layers else min(below, 1)
    if isinstance(hf.get("layer_types"), list):
        hf["layer_types"] = [hf["layer_types"][0], hf["layer_types"][-1]]
    if "num_local_experts" in hf:
        hf["num_local_experts"] = 4
    _shrink_longrope(hf)


def _shrink_longrope(hf: dict[str, Any]) -> None:
    rope = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not isinstance(rope, dict) or not isinstance(rope.get("short_factor"), list):
        return
    fraction = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    pairs = int((hf.get("head_dim") or HEAD_SIZE) * fraction) // 2
    for key in ("short_factor", "long_factor"):
        factors = rope[key]  # every n-th, keeping the low-to-high frequency order
        rope[key] = [factors[index * len(factors) // pairs] for index in range(pairs)]
    for where in (hf, rope):
        if "original_max_position_embeddings" in where:
            where["original_max_position_embeddings"] = LONGROPE_ORIGINAL


def shrink(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """A copy of ``hf`` with tiny shapes (see the module docstring); every key is kept."""
    small = copy.deepcopy(hf)
    small["vocab_size"] = VOCAB
    small["initializer_range"] = 0.2
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in small:
            small[key] = _token_id(small[key])
    (_shrink_gpt2 if family == "gpt2" else _shrink_llama_like)(small)
    return small
