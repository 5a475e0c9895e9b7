"""Bad configs: each gets a message naming the key or file and a non-zero exit, and no good data is touched.

Every case runs the `train` entry point against the folder of a finished good run (a copy of the
reference); afterwards its checkpoints, metrics and saved config are byte for byte what they were.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from reliability_helpers import Reference, tiny_config
from trainer_fixtures import load_config

from halyard.train.cli import train_main
from halyard.train.config.parse import save_resolved_config
from halyard.train.step import init_state, make_train_step


def folder_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The `train` command in this process: (exit code, message) as a shell would see them."""
    try:
        code = train_main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    except Exception as error:  # an uncaught exception: Python exits with 1 and prints it last
        return 1, f"{type(error).__name__}: {error}"
    return code, capsys.readouterr().err


# (what is wrong, command-line overrides, words the message must contain)
OVERRIDE_CASES = [
    ("unknown key", ["--trainer.stepz", "3"], ["trainer.stepz", "trainer.steps"]),
    ("wrong type", ["--trainer.steps", "many"], ["trainer.steps", "int"]),
    ("unknown model key", ["--model.num_layrs", "3"], ["model.num_layrs", "num_layers"]),
    ("unknown section type", ["--optimizer.type", "adamm"], ["adamw"]),
    ("negative learning rate", ["--optimizer.learning_rate", "-0.1"], ["learning_rate", "-0.1"]),
    ("infinite learning rate", ["--optimizer.learning_rate", "inf"], ["learning_rate", "inf"]),
    ("seq_len beyond the model", ["--data.seq_len", "128"], ["data.seq_len=128", "max_position=64"]),
    ("zero layers", ["--model.num_layers", "0"], ["num_layers", "positive"]),
    ("heads vs kv heads", ["--model.num_heads", "5"], ["num_heads=5", "num_kv_heads=2"]),
    ("mesh larger than the devices", ["--trainer.mesh.data", "16"], ["data=16", "8"]),
    ("mesh not dividing the devices", ["--trainer.mesh.tensor", "3"], ["tensor=3", "divide"]),
    (
        "batch not divisible by accumulation",
        ["--trainer.accumulation", "3"],
        ["batch_size=8", "accumulation=3"],
    ),
    ("negative checkpoint interval", ["--checkpoint.every_steps", "-1"], ["every_steps", "-1"]),
    ("keep no checkpoint", ["--checkpoint.keep_last", "0"], ["keep_last", "0"]),
    ("bad init", ["--trainer.init", "bogus"], ["trainer.init='bogus'"]),
    ("unknown nonfinite policy", ["--trainer.nonfinite", "ignore"], ["trainer.nonfinite", "skip"]),
]


@pytest.fixture
def good_run(tmp_path: Path, shared_cache: Path, reference: Reference) -> tuple[Path, Path]:
    """A finished good run (the reference's files) and its config."""
    config = tiny_config(tmp_path, "good", shared_cache)
    shutil.copytree(load_config(reference.config_path).trainer.run_dir, tmp_path / "good")
    save_resolved_config(load_config(config), tmp_path / "good")  # what resuming it would write
    return config, tmp_path / "good"


def test_bad_values_are_named_and_the_good_run_is_untouched(
    good_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = good_run
    before = folder_bytes(run_dir)
    for what, overrides, words in OVERRIDE_CASES:
        code, message = run_train(["--config", str(config), *overrides], capsys)
        assert code != 0, f"{what}: exit code 0"
        for word in words:
            assert word in message, f"{what}: {word!r} not in {message!r}"
        assert "Traceback" not in message
    after = folder_bytes(run_dir)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert changed == [], f"bad configs changed the good run: {changed}"


def test_batch_not_divisible_by_the_data_axes(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_config(tmp_path, "odd", shared_cache, trainer={"batch_size": 6})
    code, message = run_train(["--config", str(config)], capsys)
    assert code != 0 and "6" in message and ("data" in message or "divid" in message), message
    assert not (tmp_path / "odd" / "checkpoints").exists() or not any(
        (tmp_path / "odd" / "checkpoints").iterdir()
    )


def test_bad_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "binary.yaml").write_bytes(b"\x00\xff\xfe\x89PNG garbage")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "broken.yaml").write_text("trainer: {steps: 3\n")
    (tmp_path / "folder.yaml").mkdir()
    (tmp_path / "includes_missing.yaml").write_text("include: nowhere.yaml\n")
    cases = {
        "missing.yaml": ["missing.yaml"],
        "binary.yaml": ["binary.yaml", "YAML"],
        "list.yaml": ["list.yaml", "mapping"],
        "broken.yaml": ["broken.yaml", "line"],
        "folder.yaml": ["folder.yaml"],
        "includes_missing.yaml": ["nowhere.yaml"],
    }
    for name, words in cases.items():
        code, message = run_train(["--config", str(tmp_path / name)], capsys)
        assert code == 2, f"{name}: exit {code}: {message}"
        for word in words:
            assert word in message, f"{name}: {word!r} not in {message!r}"


def test_an_infinite_update_from_a_finite_loss_is_skipped() -> None:
    # What an infinite learning rate would do if it got past the config check: the loss and gradient are
    # finite, the update is not. The step must keep the old parameters and count it.
    params = {"w": jnp.ones(3)}
    step = jax.jit(
        make_train_step(
            lambda p, batch, key: (jnp.sum((p["w"] - batch["x"]) ** 2), {"num_tokens": jnp.ones(())}),
            optax.sgd(float("inf")),
        )
    )
    state = init_state(params, optax.sgd(float("inf")), jax.random.PRNGKey(0))
    new_state, metrics = step(state, {"x": jnp.zeros(3)})
    assert int(metrics["nonfinite"]) == 1 and int(new_state.nonfinite_steps) == 1
    np.testing.assert_array_equal(np.asarray(new_state.params["w"]), np.ones(3))
