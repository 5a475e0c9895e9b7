"""Every refusal names what is wrong: architecture, option, weight, shape, pickle, remote code, files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
import torch
import transformers
from hf_cases import assert_logits_close, halyard_logits, padded_batch, referee_tolerance, save, torch_logits
from safetensors.numpy import load_file, save_file

from halyard.export import (
    MissingWeightError,
    PickleRefusedError,
    ShapeMismatchError,
    UnexpectedWeightError,
    UnsupportedModelError,
    export_hf,
    import_hf,
    read_hf_config,
)
from halyard.models import model_config


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    save("llama_gqa_tied", folder)
    return folder


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    return target


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _edit_weights(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(model_type="bert", architectures=["BertForMaskedLM"]), "model_type 'bert'"),
        (dict(architectures=["LlamaForSequenceClassification"]), "LlamaForSequenceClassification"),
        (dict(auto_map={"AutoModelForCausalLM": "modeling.MyModel"}), "never runs code"),
        # longrope without its per-frequency factors (the rope type is implemented, the config incomplete)
        (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "'longrope' lacks key"),
        (dict(is_causal=False), "is_causal=False"),
        (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
        (dict(pretraining_tp=2), "pretraining_tp=2"),
        (dict(hidden_act="mish"), "mish"),
        (dict(rope_interleaved=True), "rope_interleaved=True"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_option(
    llama_folder: Path, tmp_path: Path, changes: dict, message: str
) -> None:
    folder = _copy(llama_folder, tmp_path)
    _edit_config(folder, **changes)
    with pytest.raises(UnsupportedModelError, match=message):
        import_hf(folder)


def test_keys_transformers_does_not_read_are_ignored_unless_strict(
    llama_folder: Path, tmp_path: Path
) -> None:
    folder = _copy(llama_folder, tmp_path)
    _edit_config(folder, some_new_option=3, is_llama_config=True)
    config, info = read_hf_config(folder)
    assert info.ignored_keys == ("is_llama_config", "some_new_option")
    assert config == read_hf_config(llama_folder)[0]
    with pytest.raises(UnsupportedModelError, match=r"\['is_llama_config', 'some_new_option'\].*strict"):
        import_hf(folder, strict=True)


def test_qwen2_max_window_layers_without_layer_types_sets_the_full_attention_layers(tmp_path: Path) -> None:
    save("qwen2_sliding_window", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["layer_types"]  # the older spelling: layers from max_window_layers on use the window
    config["max_window_layers"] = 1
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    halyard_config, _ = import_hf(tmp_path / "hf")
    assert halyard_config.layer_windows == (None, 4)
    del config["max_window_layers"]  # transformers' default (28) covers both layers: no window at all
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert import_hf(tmp_path / "hf")[0].layer_windows == (None, None)


@pytest.mark.parametrize(
    ("case", "layer_types"),
    [
        ("qwen2_sliding_window", ["sliding_attention", "full_attention"]),  # a window before a full layer
        ("mistral_sliding_window", ["full_attention", "sliding_attention"]),  # mistral: one kind for all
    ],
)
def test_other_per_layer_windows_are_refused(case: str, layer_types: list[str], tmp_path: Path) -> None:
    save(case, tmp_path / "hf")
    _edit_config(tmp_path / "hf", layer_types=layer_types)
    with pytest.raises(UnsupportedModelError, match="layer_types"):
        import_hf(tmp_path / "hf")


def test_a_window_on_some_layers_exports_only_as_qwen2(tmp_path: Path) -> None:
    mistral = model_config(
        "mistral",
        vocab_size=61,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        sliding_window=4,
        full_attention_layers=1,
    )
    abstract = eqx.filter_eval_shape(mistral.init, jax.random.key(0))  # refused before any array is read
    with pytest.raises(UnsupportedModelError, match="full_attention_layers=1.*use the qwen2 family"):
        export_hf(abstract, tmp_path / "mistral")


def test_missing_config_key_is_named(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=r"required key\(s\) \['num_hidden_layers'\] are missing"):
        import_hf(folder)


def test_omitted_keys_mean_what_they_mean_to_transformers(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    for key in ("rms_norm_eps", "max_position_embeddings", "rope_parameters", "hidden_act"):
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    ours = read_hf_config(folder)[0]
    theirs = transformers.LlamaConfig.from_pretrained(folder)
    assert (ours.rms_norm_eps, ours.max_position, ours.rope.theta, ours.activation) == (
        theirs.rms_norm_eps,
        theirs.max_position_embeddings,
        theirs.rope_parameters["rope_theta"],
        theirs.hidden_act,
    )


def test_unknown_override_is_named_with_a_suggestion(llama_folder: Path) -> None:
    with pytest.raises(TypeError, match="did you mean 'remat'"):
        import_hf(llama_folder, config_overrides={"rematt": "full"})


def test_missing_weight_names_the_key_and_shape(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    _edit_weights(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(
        MissingWeightError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' \(shape \(48, 32\)\)"
    ):
        import_hf(folder)


def test_unexpected_weight_is_named_not_dropped(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    _edit_weights(
        folder, lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros((3, 4), np.float32)})
    )
    with pytest.raises(
        UnexpectedWeightError, match=r"'model\.layers\.0\.mlp\.extra\.weight' \(shape \(3, 4\)\)"
    ):
        import_hf(folder)


def test_untied_head_in_a_tied_config_is_refused(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    _edit_weights(folder, lambda t: t.update({"lm_head.weight": np.ones((97, 32), np.float32)}))
    with pytest.raises(UnexpectedWeightError, match="lm_head.weight"):
        import_hf(folder)


def test_shape_mismatch_names_the_key_and_both_shapes(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    _edit_weights(folder, lambda t: t.update({"model.norm.weight": np.ones((31,), np.float32)}))
    with pytest.raises(ShapeMismatchError, match=r"'model\.norm\.weight' has shape \(31,\).*implies \(32,\)"):
        import_hf(folder)


def test_config_and_weights_that_disagree_in_width(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    _edit_config(folder, intermediate_size=64)
    with pytest.raises(
        ShapeMismatchError, match=r"mlp\.(gate|up|down)_proj\.weight' has shape \((48, 32|32, 48)\)"
    ):
        import_hf(folder)


def test_pickled_weights_need_the_flag_and_then_load_with_weights_only(tmp_path: Path) -> None:
    original = save("llama_mqa", tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(original.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(PickleRefusedError, match="allow_pickle=True"):
        import_hf(tmp_path / "hf")
    config, model = import_hf(tmp_path / "hf", allow_pickle=True)
    ids, attention_mask = padded_batch()
    expected = torch_logits(original, ids, attention_mask)
    atol = referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)


def test_missing_files_are_named(llama_folder: Path, tmp_path: Path) -> None:
    folder = _copy(llama_folder, tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        import_hf(folder)
    folder = _copy(llama_folder, tmp_path / "again")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors.*it holds: config\.json"):
        import_hf(folder)


def test_export_refuses_what_hugging_face_cannot_express(tmp_path: Path) -> None:
    mup = model_config("mup", vocab_size=61, hidden_size=32, num_layers=1, d_base=32, head_dim=8)
    with pytest.raises(UnsupportedModelError, match="'mup' has no Hugging Face architecture"):
        export_hf(eqx.filter_eval_shape(mup.init, jax.random.key(0)), tmp_path / "mup")
    tiny = dict(vocab_size=61, hidden_size=32, num_layers=1, num_heads=4)
    windowed = model_config("llama", **tiny, intermediate_size=48, num_kv_heads=2, sliding_window=4)
    with pytest.raises(UnsupportedModelError, match="sliding_window=4.*use the mistral family"):
        export_hf(eqx.filter_eval_shape(windowed.init, jax.random.key(0)), tmp_path / "llama")
    llama = model_config("llama", **tiny, intermediate_size=48, num_kv_heads=2).init(jax.random.key(0))
    with pytest.raises(ValueError, match="'float16' is not supported"):
        export_hf(llama, tmp_path / "f16", dtype="float16")
    export_hf(llama, tmp_path / "once")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_hf(llama, tmp_path / "once")
    export_hf(llama, tmp_path / "once", overwrite=True)
    with pytest.raises(ValueError, match="vocab_size=62"):
        export_hf(llama, tmp_path / "big", vocab_size=62)
