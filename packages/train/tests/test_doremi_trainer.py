"""DoReMi through the command line: ``halyard doremi`` on the built-in domains (reference, proxy, the learned
weights, the main run's config), the noise domain's weight, the weights' plot, and a proxy run killed with
SIGKILL and resumed to the same bits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from trainer_fixtures import (
    StopAfter,
    assert_bitwise_equal,
    fails,
    load_config,
    run_cli,
    start_processes,
    write_config,
)

from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.cli import main
from halyard.train.plan.step_memory import step_memory
from halyard.train.run.setup import RunSetup
from halyard.train.trackers.jsonl import read_jsonl
from halyard.train.trainer.trainer import Trainer

DOMAINS = ("noise", "prose", "python", "repetitive")
STEPS = 120


def doremi_sections(cache: Path) -> dict[str, Any]:
    """A reduced ``doremi-demo``: the same four domains, a smaller model, fewer steps."""
    return {
        "model": {"vocab_size": 264, "max_position": 64},
        "data": {
            "builtin_corpus": None,
            "tokenizer": "bytes",
            "seq_len": 64,
            "validation_fraction": 0.1,
            "cache_dir": str(cache),
            "mixture": {
                "sources": {
                    "python": {"builtin_corpus": "python-stdlib", "max_documents": 12},
                    "prose": {"builtin_corpus": "english-prose"},
                    "repetitive": {"builtin_corpus": "repetitive", "max_documents": 60},
                    "noise": {"builtin_corpus": "noise", "max_documents": 60},
                },
                "weights": dict.fromkeys(DOMAINS, 1),
            },
        },
        "trainer": {"steps": STEPS, "batch_size": 16, "eval_every": STEPS, "eval_batches": 1},
        "checkpoint": {"every_steps": STEPS},
    }


@pytest.fixture(scope="module")
def doremi_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``halyard doremi --config C`` once, its output and folder."""
    tmp_path = tmp_path_factory.mktemp("doremi")
    path = write_config(
        tmp_path / "doremi.yaml", tmp_path / "run", tmp_path / "cache", **doremi_sections(tmp_path / "cache")
    )
    done = subprocess.run(
        [sys.executable, "-m", "halyard.train.cli", "doremi", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"tmp": tmp_path, "config": path, "folder": tmp_path / "run", "stdout": done.stdout}


def test_doremi_writes_the_learned_weights_and_the_main_run_config(doremi_run: dict[str, Any]) -> None:
    folder: Path = doremi_run["folder"]
    learned = json.loads((folder / "domain_weights.json").read_text())
    assert learned["steps"] == STEPS and sorted(learned["sources"]) == list(DOMAINS)
    assert learned["sources"]["noise"] == {"builtin_corpus": "noise", "max_documents": 60}
    for kind in ("average", "final"):
        assert sorted(learned[kind]) == list(DOMAINS) and sum(learned[kind].values()) == pytest.approx(
            1, abs=1e-5
        )
    # Noise no model can learn: its excess loss vanishes and so does its weight (below the uniform's fifth).
    assert learned["average"]["noise"] < 0.25 / 5, learned["average"]
    # The average is the mean of the logged weights of every step.
    records = [row for row in read_jsonl(folder / "proxy" / "metrics.jsonl") if "doremi/noise/weight" in row]
    assert [row["step"] for row in records] == list(range(1, STEPS + 1))
    for name in DOMAINS:
        logged = np.mean([row[f"doremi/{name}/weight"] for row in records])
        assert learned["average"][name] == pytest.approx(logged, rel=1e-5)
        assert learned["final"][name] == pytest.approx(records[-1][f"doremi/{name}/weight"], rel=1e-6)
        assert all(row[f"doremi/{name}/excess_loss"] >= 0 for row in records)
    # The main run's config: the learned average as its weights, and the command that trains it.
    main_config = load_config(folder / "main.yaml")
    assert main_config.data.mixture.weights == pytest.approx(learned["average"], abs=1e-6)
    assert main_config.trainer.run_dir == str(folder / "main") and main_config.trainer.objective == "lm"
    assert f"train --config {folder / 'main.yaml'}" in doremi_run["stdout"]


def test_halyard_plot_draws_the_weights_trajectory(doremi_run: dict[str, Any]) -> None:
    proxy = doremi_run["folder"] / "proxy"
    out = doremi_run["tmp"] / "weights.png"
    assert main(["plot", "--run", str(proxy), "--metric", "doremi/*/weight", "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000


def proxy_config(
    doremi_run: dict[str, Any], name: str, checkpoint_every: int = STEPS, **trainer: Any
) -> Path:
    """A proxy run of its own (``trainer.objective: doremi``) against the command's reference, checkpointed
    every ``checkpoint_every`` steps (and at its last step, or when asked to stop)."""
    tmp_path: Path = doremi_run["tmp"]
    sections = doremi_sections(tmp_path / "cache")
    sections["trainer"].update(objective="doremi", **trainer)
    sections["checkpoint"] = {"every_steps": checkpoint_every}
    sections["doremi"] = {"reference": str(doremi_run["folder"] / "reference")}
    return write_config(tmp_path / f"{name}.yaml", tmp_path / name, tmp_path / "cache", **sections)


def test_halyard_plan_compiles_the_proxy_step(doremi_run: dict[str, Any]) -> None:
    config = load_config(proxy_config(doremi_run, "planned"))
    plan = step_memory(config, jax.devices()[:1])
    weights = sum(
        leaf.size * 4 for leaf in jax.tree_util.tree_leaves(RunSetup(config).abstract_trained.abstract)
    )
    assert plan.batch > weights  # the reference's weights come with the batch


def test_the_proxy_on_an_fsdp_mesh_learns_the_same_weights(doremi_run: dict[str, Any]) -> None:
    """The proxy and its reference sharded over 8 devices with FSDP: the first steps' domain weights, excess
    losses and per-domain losses are those of the command's (data-parallel) proxy."""
    fsdp = {"layout": "fsdp", "min_shard": 1, "mesh": {"data": 1, "fsdp": 8}}
    config = load_config(proxy_config(doremi_run, "fsdp", **fsdp))
    with pytest.raises(SystemExit):
        Trainer(config, preemption=StopAfter(4)).fit()
    got = [row for row in read_jsonl(Path(config.trainer.run_dir) / "metrics.jsonl") if "loss" in row]
    expected = read_jsonl(doremi_run["folder"] / "proxy" / "metrics.jsonl")[: len(got)]
    assert len(got) == 4
    for mine, theirs in zip(got, expected, strict=True):
        for name in DOMAINS:
            for key in (f"doremi/{name}/weight", f"doremi/{name}/excess_loss", f"train/{name}/loss"):
                np.testing.assert_allclose(
                    float(mine[key]), float(theirs[key]), rtol=1e-4, atol=1e-6, err_msg=key
                )


def newest_checkpoint(checkpoints: Path) -> int:
    """The newest complete checkpoint's step (0 if none); one being written is skipped without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return latest_complete(checkpoints) or 0


def test_a_killed_proxy_run_resumes_to_the_same_bits(doremi_run: dict[str, Any]) -> None:
    """The proxy (its domain weights and their sum in the checkpointed state) killed with SIGKILL after a
    checkpoint and resumed ends where the uninterrupted proxy run of the command ended. A checkpoint every
    30 steps: one every step made the resumed run write 117 of them (two thirds of this test's time)."""
    tmp_path: Path = doremi_run["tmp"]
    folder: Path = doremi_run["folder"]
    every = 30
    path = proxy_config(doremi_run, "killed", checkpoint_every=every)
    code = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--config", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoints = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if newest_checkpoint(checkpoints) >= every:
                break
            time.sleep(0.05)
        process.kill()
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert newest_checkpoint(checkpoints) < STEPS  # resumed from a checkpoint before the end
    finished = run_cli(["--config", str(path)])
    assert finished.returncode == 0, finished.stderr[-3000:]
    resumed = Trainer(load_config(path)).restore_state()
    whole = Trainer(load_config(path, f"--trainer.run_dir={folder / 'proxy'}")).restore_state()
    assert int(resumed.step) == STEPS
    assert_bitwise_equal(whole.params, resumed.params)
    assert_bitwise_equal(whole.opt_state, resumed.opt_state)  # the domain weights and their running sum too


def test_a_given_reference_is_used_and_finished_runs_are_kept(doremi_run: dict[str, Any]) -> None:
    """``--reference RUN`` trains no reference; the command run again keeps the finished proxy and writes the
    same weights."""
    folder: Path = doremi_run["folder"]
    before = json.loads((folder / "domain_weights.json").read_text())
    args = ["doremi", "--config", str(doremi_run["config"]), "--reference", str(folder / "reference")]
    done = subprocess.run([sys.executable, "-m", "halyard.train.cli", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the reference run" not in done.stdout and f"{folder / 'proxy'} is finished; kept" in done.stdout
    assert json.loads((folder / "domain_weights.json").read_text()) == before


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "--trainer.accumulation=2",
            "trainer.accumulation=2: trainer.objective=doremi steps the domain weights",
        ),
        ("--doremi.reference=", "doremi.reference is empty: give the reference run's folder"),
        ("--doremi.smoothing=1", "doremi.smoothing=1.0: must be in [0, 1)"),
        ("--trainer.invariant=true", "trainer.invariant: not supported with trainer.objective=doremi"),
    ],
)
def test_a_proxy_config_that_cannot_train_is_refused_in_one_line(
    doremi_run: dict[str, Any], capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    path = proxy_config(doremi_run, "refused")
    code, error = fails(capsys, ["train", "--config", str(path), override])
    assert code == 2 and message in error, error


@pytest.mark.multiprocess
def test_two_processes_train_the_proxy_like_one(doremi_run: dict[str, Any]) -> None:
    """2 processes x 2 devices: the proxy (the reference restored onto both processes' devices) logs the
    domain weights, excess losses and per-domain losses of the 8-device single-process proxy."""
    processes = start_processes(["--config", str(proxy_config(doremi_run, "two-hosts", steps=4))])
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-3000:]
    alone = Trainer(load_config(proxy_config(doremi_run, "one-host", steps=4))).fit()
    logged = [row for row in read_jsonl(doremi_run["tmp"] / "two-hosts" / "metrics.jsonl") if "loss" in row]
    assert len(logged) == len(alone.history) == 4
    for got, expected in zip(logged, alone.history, strict=True):
        for name in DOMAINS:
            for key in (f"doremi/{name}/weight", f"doremi/{name}/excess_loss", f"train/{name}/loss"):
                np.testing.assert_allclose(float(got[key]), expected[key], rtol=1e-4, atol=1e-6, err_msg=key)
