"""Real ``config.json`` files of published checkpoints (fixtures/hf-configs): what is accepted and refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hf_corpus import CORPUS, SUPPORTED, accepted_entries, entries, has_model_code, is_quantized, load

from halyard.export import UnsupportedModelError, read_hf_config
from halyard.export.config_reading import config_from_hf_dict


def _id(entry: dict[str, Any]) -> str:
    return entry["file"].removesuffix(".json")


def test_the_index_lists_every_file() -> None:
    listed = {entry["file"] for entry in entries()}
    on_disk = {str(path.relative_to(CORPUS)) for path in CORPUS.glob("*/*.json")}
    assert listed == on_disk and len(listed) == 62


@pytest.mark.parametrize("entry", accepted_entries(), ids=_id)
def test_every_unquantized_config_of_a_supported_family_is_accepted(entry: dict[str, Any]) -> None:
    hf = load(entry)
    config, info = config_from_hf_dict(hf, where=entry["file"])
    assert config.family == info.family == entry["family"]
    assert info.vocab_size == hf["vocab_size"]
    eos = hf.get("eos_token_id")
    assert config.eos_token_ids == tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])


QUANTIZED = [e for e in entries() if e["family"] in SUPPORTED and is_quantized(load(e))]


@pytest.mark.parametrize("entry", QUANTIZED, ids=_id)
def test_quantized_configs_are_refused_naming_method_and_bits(entry: dict[str, Any]) -> None:
    settings = load(entry)["quantization_config"]
    expected = f"{settings['quant_method'].upper()} {settings['bits']}-bit"
    with pytest.raises(UnsupportedModelError, match=f"quantized \\({expected}.*dequantize") as error:
        config_from_hf_dict(load(entry), where=entry["file"])
    assert "not supported" not in str(error.value)


def test_the_corpus_covers_awq_and_gptq() -> None:
    methods = {load(e)["quantization_config"]["quant_method"] for e in QUANTIZED}
    assert methods == {"awq", "gptq"}


def test_an_mlx_quantized_config_is_refused_naming_it() -> None:
    # mlx-community re-uploads add "quantization" (not quantization_config) to the original config
    hf = {**load({"file": "qwen2/Qwen2.5-0.5B.json"}), "quantization": {"group_size": 64, "bits": 4}}
    with pytest.raises(UnsupportedModelError, match=r"quantized \(MLX 4-bit, 'quantization'\)"):
        config_from_hf_dict(hf)


# A supported family whose auto_map names model code (Phi-4-mini ships a copy of Phi3ForCausalLM's)
MODEL_CODE = [e for e in entries() if e["family"] in SUPPORTED and has_model_code(load(e))]


@pytest.mark.parametrize("entry", MODEL_CODE, ids=_id)
def test_configs_naming_model_code_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedModelError, match="'auto_map' entries.*never runs code"):
        config_from_hf_dict(load(entry), where=entry["file"])


OTHER_FAMILIES = [e for e in entries() if e["family"] not in SUPPORTED]


@pytest.mark.parametrize("entry", OTHER_FAMILIES, ids=_id)
def test_other_families_are_refused_naming_the_family(entry: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedModelError, match=f"model_type '{entry['family']}'.*does not implement"):
        config_from_hf_dict(load(entry), where=entry["file"])


def test_the_corpus_has_every_kind_of_refusal() -> None:
    # the families without a Hugging Face spec shrink as specs are added (falcon and qwen2_moe stay)
    assert {"falcon", "qwen2_moe"} <= {e["family"] for e in OTHER_FAMILIES}
    assert len(accepted_entries()) >= 49 and len(QUANTIZED) >= 4
    assert len(accepted_entries()) + len(QUANTIZED) + len(MODEL_CODE) + len(OTHER_FAMILIES) == len(entries())


def _file(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / name).read_text())


# Keys the users met (SmolLM2, Qwen2.5, gpt2-xl, distilgpt2), added to corpus files of the same family.
UNREAD_KEYS = [
    ("llama/Llama-3.2-3B.json", {"is_llama_config": True, "rope_interleaved": False}),
    ("llama/Llama-3.2-3B.json", {"transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16"}}}),
    ("qwen2/Qwen2.5-7B-Instruct.json", {"use_mrope": False}),
    ("gpt2/gpt2.json", {"output_past": True, "_num_labels": 1, "unk_token_id": 50256}),
]


@pytest.mark.parametrize(("name", "extra"), UNREAD_KEYS)
def test_keys_transformers_does_not_read_are_ignored_and_logged(
    name: str, extra: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    hf = _file(name)
    with caplog.at_level(logging.DEBUG, logger="halyard.export"):
        config, info = config_from_hf_dict({**hf, **extra}, where=name)
    assert config == config_from_hf_dict(hf)[0]
    unread = sorted(key for key in extra if key not in ("rope_interleaved", "use_mrope"))
    assert list(info.ignored_keys) == sorted(set(unread) | set(config_from_hf_dict(hf)[1].ignored_keys))
    assert not unread or f"ignored keys (transformers does not read them for {info.family})" in caplog.text
    if unread:
        with pytest.raises(UnsupportedModelError, match=f"{unread[0]}.*strict=True refuses"):
            config_from_hf_dict({**hf, **extra}, strict=True)
    else:  # rope_interleaved / use_mrope false are named by the rule: strict accepts them
        assert config_from_hf_dict({**hf, **extra}, strict=True)[0] == config


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        # a real Llama 3 file with a rope type Halyard does not implement (Phi-3's longrope)
        ("llama/Llama-3.1-8B.json", {"rope_scaling": {"type": "longrope", "factor": 2.0}}, "'longrope'"),
        ("llama/Llama-3.2-3B.json", {"rope_interleaved": True}, "rope_interleaved=True"),
        ("qwen2/Qwen2.5-7B-Instruct.json", {"use_mrope": True}, "use_mrope=True"),
        ("llama/Llama-2-7b-hf.json", {"pretraining_tp": 2}, "pretraining_tp=2"),
        ("gpt2/gpt2.json", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
        ("llama/Llama-3.1-8B.json", {"attention_chunk_size": 8192}, "attention_chunk_size=8192"),
        ("llama/Yi-6B.json", {"sliding_window": 4096}, "sliding_window=4096"),
        ("mistral/Mistral-7B-v0.1.json", {"auto_map": {"AutoModelForCausalLM": "m.M"}}, "never runs code"),
    ],
)
def test_a_key_that_changes_the_computation_is_refused(name: str, change: dict, message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        config_from_hf_dict({**_file(name), **change}, where=name)


def test_a_tokenizer_only_auto_map_is_not_remote_model_code() -> None:
    hf = {**_file("llama/Llama-3.2-3B.json"), "auto_map": {"AutoTokenizer": "Xenova/gpt-4o"}}
    assert config_from_hf_dict(hf)[0] == config_from_hf_dict(_file("llama/Llama-3.2-3B.json"))[0]


def test_a_config_without_model_type_is_read_by_its_architecture() -> None:
    # distilgpt2's 2019 hub file names only the architecture
    hf = {k: v for k, v in _file("gpt2/distilgpt2--resaved-4.51.1.json").items() if k != "model_type"}
    assert config_from_hf_dict(hf)[0].family == "gpt2"
    with pytest.raises(UnsupportedModelError, match=r"no model_type and architectures \['BertModel'\]"):
        config_from_hf_dict({**hf, "architectures": ["BertModel"]})


def test_gpt2_keys_spelled_as_transformers_attribute_map(tmp_path: Path) -> None:
    hf = _file("gpt2/gpt2.json")
    renamed = {**{k: v for k, v in hf.items() if k != "n_embd"}, "hidden_size": hf["n_embd"]}
    assert config_from_hf_dict(renamed)[0] == config_from_hf_dict(hf)[0]
    with pytest.raises(UnsupportedModelError, match="hidden_size=32 and n_embd=768 disagree"):
        config_from_hf_dict({**hf, "hidden_size": 32})


def test_value_forms_seen_in_the_wild() -> None:
    # rope_theta as an int, rope_scaling null, torch_dtype vs dtype, max_window_layers above the layers
    qwen = config_from_hf_dict(_file("qwen2/Qwen2.5-3B-Instruct.json"))[0]
    assert qwen.sliding_window is None and qwen.rope.theta == 1e6  # type: ignore[attr-defined]
    falcon3 = config_from_hf_dict(_file("llama/Falcon3-7B-Instruct.json"))[0]
    assert falcon3.rope.theta == 1000042.0 and isinstance(falcon3.rope.theta, float)  # type: ignore[attr-defined]
    v5 = config_from_hf_dict(_file("llama/Meta-Llama-3-8B-Instruct--printed-transformers-5.7.0.json"))[0]
    assert v5 == config_from_hf_dict(_file("llama/Meta-Llama-3-8B-Instruct.json"))[0]
    linear = config_from_hf_dict(_file("llama/deepseek-coder-1.3b-base.json"))[0]
    assert (linear.rope.scaling, linear.rope.factor) == ("linear", 4.0)  # type: ignore[attr-defined]
    mistral = config_from_hf_dict(_file("mistral/Mistral-7B-v0.1.json"))[0]
    assert mistral.sliding_window == 4096  # type: ignore[attr-defined]


def test_generation_config_eos_ids_join_the_config_ones(tmp_path: Path) -> None:
    # the early Meta-Llama-3-8B-Instruct revision: config.json 128001, generate stops at 128009 too
    (tmp_path / "config.json").write_text(json.dumps(_file("llama/Meta-Llama-3-8B-Instruct.json")))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009]}))
    config, info = read_hf_config(tmp_path)
    assert config.eos_token_ids == info.eos_token_ids == (128001, 128009)
