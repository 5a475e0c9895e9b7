"""DoReMi through the command line: ``halyard doremi`` on the built-in domains (reference, proxy, the learned
weights, the main run's config), the noise domain's weight, the weights' plot, and a proxy run killed with
SIGKILL and resumed to the same bits."""

from __future__ import annotations

import contextlib
import io
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
from float_tolerance import FUNCTION_TERMS, decoder_terms, summation_tolerance, training_terms
from run_wide import shared_folder
from trainer_fixtures import (
    TINY,
    StopAfter,
    assert_bitwise_equal,
    fails,
    load_config,
    start_processes,
    write_config,
)

from halyard.models import LlamaConfig
from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.cli import main
from halyard.train.plan.step_memory import step_memory
from halyard.train.run.setup import RunSetup
from halyard.train.trackers.jsonl import read_jsonl
from halyard.train.trainer.trainer import Trainer

DOMAINS = ("noise", "prose", "python", "repetitive")
# The noise domain's average weight (bound 0.05) was 0.026 after 80 steps (0.041 after 60, 0.015 after 120).
STEPS = 80
ROWS, SEQ_LEN = 16, 64  # a proxy step's batch (doremi_sections)
MODEL = LlamaConfig(
    **{**{name: value for name, value in TINY["model"].items() if name != "type"}, "vocab_size": 264}
)
# A domain's loss on another mesh or process: the forward pass, the vocabulary's log-softmax and the batch's
# tokens; each update behind it adds a training step's sums (as trainer_fixtures.assert_trajectory_close).
FORWARD_TERMS = decoder_terms(MODEL, SEQ_LEN) + MODEL.vocab_size + ROWS * SEQ_LEN
UPDATE_TERMS = training_terms(MODEL, ROWS, SEQ_LEN) + MODEL.vocab_size
EPS = float(np.finfo(np.float32).eps)


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
    """``halyard doremi --config C`` once per pytest run (`main`, what the command runs, in the first test
    worker that needs it; the file's tests may span workers), its output and folder. Tests write their own
    runs into their own folders; the command's folder is only read (and rewritten with the same contents)."""

    def doremi(folder: Path) -> None:
        path = write_config(
            folder / "doremi.yaml", folder / "run", folder / "cache", **doremi_sections(folder / "cache")
        )
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["doremi", "--config", str(path)]) == 0
        (folder / "stdout.txt").write_text(printed.getvalue())

    folder = shared_folder(tmp_path_factory, "doremi-command", doremi)[0]
    return {
        "tmp": folder,
        "config": folder / "doremi.yaml",
        "folder": folder / "run",
        "stdout": (folder / "stdout.txt").read_text(),
    }


def test_doremi_writes_the_learned_weights_and_the_main_run_config(doremi_run: dict[str, Any]) -> None:
    folder: Path = doremi_run["folder"]
    learned = json.loads((folder / "domain_weights.json").read_text())
    assert learned["steps"] == STEPS and sorted(learned["sources"]) == list(DOMAINS)
    assert learned["sources"]["noise"] == {"builtin_corpus": "noise", "max_documents": 60}
    # A step's weights sum to 1 but for the softmax's k-sum and divisions and the smoothing's 3 roundings each;
    # the average adds its float32 running sum of STEPS weights and the division.
    for kind, terms in (("average", 2 * len(DOMAINS) + 4 + STEPS + 1), ("final", 2 * len(DOMAINS) + 4)):
        assert sorted(learned[kind]) == list(DOMAINS) and sum(learned[kind].values()) == pytest.approx(
            1, rel=0, abs=summation_tolerance(1, terms)
        )
    # Noise no model can learn: its excess loss vanishes and so does its weight (below the uniform's fifth).
    assert learned["average"]["noise"] < 0.25 / 5, learned["average"]
    # The average is the mean of the logged weights of every step.
    records = [row for row in read_jsonl(folder / "proxy" / "metrics.jsonl") if "doremi/noise/weight" in row]
    assert [row["step"] for row in records] == list(range(1, STEPS + 1))
    for name in DOMAINS:
        logged = np.mean([row[f"doremi/{name}/weight"] for row in records])
        # the state's float32 running sum of the same STEPS weights and its division, against float64's
        bound = summation_tolerance(logged, STEPS + 1)
        assert learned["average"][name] == pytest.approx(logged, rel=0, abs=bound)
        # the state's weights are the last step's logged ones (the same float32 values)
        assert learned["final"][name] == records[-1][f"doremi/{name}/weight"]
        assert all(row[f"doremi/{name}/excess_loss"] >= 0 for row in records)
    # The main run's config: the learned average as its weights, and the command that trains it.
    main_config = load_config(folder / "main.yaml")
    assert main_config.data.mixture.weights == {
        name: round(value, 6) for name, value in learned["average"].items()
    }
    assert main_config.trainer.run_dir == str(folder / "main") and main_config.trainer.objective == "lm"
    assert f"train --config {folder / 'main.yaml'}" in doremi_run["stdout"]


def test_halyard_plot_draws_the_weights_trajectory(doremi_run: dict[str, Any], tmp_path: Path) -> None:
    proxy = doremi_run["folder"] / "proxy"
    out = tmp_path / "weights.png"
    assert main(["plot", "--run", str(proxy), "--metric", "doremi/*/weight", "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000


def proxy_config(
    doremi_run: dict[str, Any], where: Path, name: str, checkpoint_every: int = STEPS, **trainer: Any
) -> Path:
    """A proxy run of its own (``trainer.objective: doremi``) in ``where/name`` against the command's reference,
    checkpointed every ``checkpoint_every`` steps (and at its last step, or when asked to stop)."""
    cache: Path = doremi_run["tmp"] / "cache"
    sections = doremi_sections(cache)
    sections["trainer"].update(objective="doremi", **trainer)
    sections["checkpoint"] = {"every_steps": checkpoint_every}
    sections["doremi"] = {"reference": str(doremi_run["folder"] / "reference")}
    return write_config(where / f"{name}.yaml", where / name, cache, **sections)


def test_halyard_plan_compiles_the_proxy_step(doremi_run: dict[str, Any], tmp_path: Path) -> None:
    config = load_config(proxy_config(doremi_run, tmp_path, "planned"))
    plan = step_memory(config, jax.devices()[:1])
    weights = sum(
        leaf.size * 4 for leaf in jax.tree_util.tree_leaves(RunSetup(config).abstract_trained.abstract)
    )
    assert plan.batch > weights  # the reference's weights come with the batch


def test_the_proxy_on_an_fsdp_mesh_learns_the_same_weights(
    doremi_run: dict[str, Any], tmp_path: Path
) -> None:
    """The proxy and its reference sharded over 8 devices with FSDP: the first steps' domain weights, excess
    losses and per-domain losses are those of the command's (data-parallel) proxy."""
    fsdp = {"layout": "fsdp", "min_shard": 1, "mesh": {"data": 1, "fsdp": 8}}
    config = load_config(proxy_config(doremi_run, tmp_path, "fsdp", **fsdp))
    with pytest.raises(SystemExit):
        Trainer(config, preemption=StopAfter(4)).fit()
    got = [row for row in read_jsonl(Path(config.trainer.run_dir) / "metrics.jsonl") if "loss" in row]
    expected = read_jsonl(doremi_run["folder"] / "proxy" / "metrics.jsonl")[: len(got)]
    assert len(got) == 4
    assert_proxy_steps_close(got, expected)


def assert_proxy_steps_close(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """The proxy's logged steps on another mesh or process (``got``) within summation order of ``expected``'s.

    A domain's loss at step ``u + 1``: the forward pass and the ``u`` updates behind it (`FORWARD_TERMS`,
    `UPDATE_TERMS`). Its excess loss is a mean of the proxy's token losses minus the reference's (its forward
    alone), clipped: within both losses' bounds at the proxy's loss size. The weights' softmax takes the excess
    losses (step size 1) as absolute errors of its log-arguments, which come out as relative errors of the
    weights: twice each step's largest excess error (the softmax is shift-invariant: the errors' spread is
    what moves it) plus the exp, the k-sum, the division and the smoothing's, summed over the steps so far.
    """
    spread = 0.0
    for updates, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        excess_errors = []
        for name in DOMAINS:
            key = f"train/{name}/loss"
            scale = np.nan_to_num(float(theirs[key]))  # NaN where the batch has no rows of the domain
            loss_bound = summation_tolerance(scale, FORWARD_TERMS + updates * UPDATE_TERMS)
            np.testing.assert_allclose(float(mine[key]), theirs[key], atol=loss_bound, rtol=0, err_msg=key)
            excess_bound = loss_bound + summation_tolerance(scale, FORWARD_TERMS)
            excess_errors.append(excess_bound)
            key = f"doremi/{name}/excess_loss"
            np.testing.assert_allclose(float(mine[key]), theirs[key], atol=excess_bound, rtol=0, err_msg=key)
        spread += 2 * max(excess_errors) + EPS * (2 * FUNCTION_TERMS + len(DOMAINS) + 4)
        for name in DOMAINS:
            key = f"doremi/{name}/weight"
            np.testing.assert_allclose(float(mine[key]), theirs[key], rtol=spread, atol=0, err_msg=key)


def newest_checkpoint(checkpoints: Path) -> int:
    """The newest complete checkpoint's step (0 if none); one being written is skipped without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return latest_complete(checkpoints) or 0


def test_a_killed_proxy_run_resumes_to_the_same_bits(doremi_run: dict[str, Any], tmp_path: Path) -> None:
    """The proxy (its domain weights and their sum in the checkpointed state) killed with SIGKILL after a
    checkpoint and resumed ends where the uninterrupted proxy run of the command ended. A checkpoint every
    20 steps: one every step made a resumed run of 120 steps write 117 of them (two thirds of its time)."""
    folder: Path = doremi_run["folder"]
    every = 20
    path = proxy_config(doremi_run, tmp_path, "killed", checkpoint_every=every)
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
    # The same run resumed by `Trainer.fit` (what `train` runs) in this process: the command's proxy programs.
    Trainer(load_config(path)).fit()
    resumed = Trainer(load_config(path)).restore_state()
    whole = Trainer(load_config(path, f"--trainer.run_dir={folder / 'proxy'}")).restore_state()
    assert int(resumed.step) == STEPS
    assert_bitwise_equal(whole.params, resumed.params)
    assert_bitwise_equal(whole.opt_state, resumed.opt_state)  # the domain weights and their running sum too


def test_a_given_reference_is_used_and_finished_runs_are_kept(
    doremi_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--reference RUN`` trains no reference; the command run again keeps the finished proxy and writes the
    same weights. (`main`, what the command runs, in this process: the fixture's run started it the same way.)"""
    folder: Path = doremi_run["folder"]
    before = json.loads((folder / "domain_weights.json").read_text())
    capsys.readouterr()
    assert (
        main(["doremi", "--config", str(doremi_run["config"]), "--reference", str(folder / "reference")]) == 0
    )
    printed = capsys.readouterr().out
    assert "the reference run" not in printed and f"{folder / 'proxy'} is finished; kept" in printed
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
    doremi_run: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    override: str,
    message: str,
) -> None:
    path = proxy_config(doremi_run, tmp_path, "refused")
    code, error = fails(capsys, ["train", "--config", str(path), override])
    assert code == 2 and message in error, error


@pytest.mark.multiprocess
def test_two_processes_train_the_proxy_like_one(doremi_run: dict[str, Any], tmp_path: Path) -> None:
    """2 processes x 2 devices: the proxy (the reference restored onto both processes' devices) logs the
    domain weights, excess losses and per-domain losses of the 8-device single-process proxy."""
    processes = start_processes(["--config", str(proxy_config(doremi_run, tmp_path, "two-hosts", steps=4))])
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-3000:]
    alone = Trainer(load_config(proxy_config(doremi_run, tmp_path, "one-host", steps=4))).fit()
    logged = [row for row in read_jsonl(tmp_path / "two-hosts" / "metrics.jsonl") if "loss" in row]
    assert len(logged) == len(alone.history) == 4
    assert_proxy_steps_close(logged, alone.history)
