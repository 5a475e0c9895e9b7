"""Bad Hugging Face folders are refused by name, and nothing is executed that the user did not ask for:
no pickle, no YAML object tags, no remote code, no config value run as code.

Each "payload" below would create a marker file if it were ever executed; the tests check the refusal
message and that the marker does not exist.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from reliability_helpers import tiny_config
from safetensors.numpy import load_file, save_file
from trainer_fixtures import load_config

from halyard.export import export_hf, import_hf
from halyard.export.errors import (
    MissingWeightError,
    PickleRefusedError,
    ShapeMismatchError,
    UnexpectedWeightError,
    UnsupportedModelError,
)
from halyard.train.cli import train_main


class ExecutesWhenUnpickled:
    """A pickle payload: unpickling it runs ``open(marker, "w")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid Hugging Face folder of the tiny Llama."""
    root = tmp_path_factory.mktemp("hf")
    model = load_config(tiny_config(root, "model", root / "cache")).model.init(jax.random.PRNGKey(0))
    return export_hf(model, root / "llama")


def copy_of(hf_folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(hf_folder, tmp_path / "copy"))


def edit_weights(folder: Path, edit) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_the_valid_folder_imports(hf_folder: Path) -> None:
    config, _ = import_hf(hf_folder)
    assert config.num_layers == 2


def test_missing_config(hf_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(hf_folder, tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        import_hf(folder)


def test_missing_weight(hf_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(hf_folder, tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    edit_weights(folder, lambda tensors: tensors.pop(name))
    with pytest.raises(MissingWeightError, match=name):
        import_hf(folder)


def test_extra_weight(hf_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(hf_folder, tmp_path)
    edit_weights(
        folder, lambda tensors: tensors.update({"model.layers.0.surprise.weight": np.zeros(3, np.float32)})
    )
    with pytest.raises(UnexpectedWeightError, match="surprise"):
        import_hf(folder)


def test_mismatched_shape(hf_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(hf_folder, tmp_path)
    name = "model.layers.0.mlp.up_proj.weight"
    edit_weights(folder, lambda tensors: tensors.update({name: np.zeros((5, 7), np.float32)}))
    with pytest.raises(ShapeMismatchError, match=name):
        import_hf(folder)


def test_unsupported_architecture(hf_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(hf_folder, tmp_path)
    edit_config(folder, architectures=["BertForMaskedLM"], model_type="bert")
    with pytest.raises(UnsupportedModelError, match="bert|Bert"):
        import_hf(folder)


def test_pickled_weights_are_never_loaded_unless_asked(hf_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(hf_folder, tmp_path)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(ExecutesWhenUnpickled(marker)))
    with pytest.raises(PickleRefusedError, match="pytorch_model.bin"):
        import_hf(folder)
    assert not marker.exists()


def test_remote_code_is_refused_and_never_imported(hf_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(hf_folder, tmp_path)
    marker = tmp_path / "remote-code-ran"
    (folder / "modeling_custom.py").write_text(f"open({str(marker)!r}, 'w')\n")
    edit_config(folder, auto_map={"AutoModelForCausalLM": "modeling_custom.CustomModel"})
    with pytest.raises(UnsupportedModelError, match="trust_remote_code"):
        import_hf(folder)
    assert not marker.exists()


def exit_code_and_stderr(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        train_main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0), capsys.readouterr().err
    except Exception as error:  # uncaught: the process would exit with 1 and this message last
        return 1, f"{type(error).__name__}: {error}"
    return 0, capsys.readouterr().err


def test_yaml_object_tags_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "yaml-ran"
    payload = f"!!python/object/apply:os.system ['touch {marker}']"
    (tmp_path / "evil.yaml").write_text(f"trainer: {payload}\n")
    (tmp_path / "includer.yaml").write_text("include: evil.yaml\n")
    for name in ("evil.yaml", "includer.yaml"):
        code, message = exit_code_and_stderr(["--config", str(tmp_path / name)], capsys)
        assert code == 2 and "python/object/apply" in message, message
    assert not marker.exists()


def test_config_values_are_never_run_as_code(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "config-ran"
    config = tiny_config(tmp_path, "run", shared_cache)
    python_code = f"__import__('os').system('touch {marker}')"
    shell_code = f"$(touch {marker})"
    cases = [
        ["--data.tokenizer", python_code],
        ["--data.builtin_corpus", "null", "--data.sources", f"[{shell_code!r}]"],
        ["--model.type", "os.system"],
        ["--optimizer.type", "builtins.eval"],
        ["--trainer.init", f"hf:{shell_code}"],
    ]
    for overrides in cases:
        code, message = exit_code_and_stderr(["--config", str(config), *overrides], capsys)
        assert code != 0, (overrides, message)
    assert not marker.exists()
