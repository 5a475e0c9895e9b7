"""trainer.invariant through `train`: the same config on 1, 2, 4 and 8 devices, data-parallel and FSDP,
and on 2 processes x 4 devices (fsdp 8 from the start, data 8 resumed after a kill), logs bitwise-equal
losses and gradient norms for 10 steps (AdamW clipping every step, Lion on data 8 and fsdp 8) and the same
validation loss, and ends with bitwise-equal parameters; an 8-device run killed (SIGKILL) after its step-5
checkpoint and resumed on 2 devices, or on 2 processes, equals the uninterrupted 1-device run, and says in
one line that it stays bitwise. What the invariant step does not cover is refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import pytest
from run_wide import run_root, shared_folder
from trainer_fixtures import assert_bitwise_equal, fails, load_config, run_cli, start_processes, write_config

from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.run.setup import RunSetup
from halyard.train.trainer.trainer import Trainer

pytestmark = pytest.mark.slow

STEPS = 10  # bitwise or not shows at the first step; 10 steps are 2 checkpoints and a resume
# max_grad_norm below the tiny model's gradient norms (0.6 to 1.0): clipping acts at every step.
# A tenth of the windows held out: the validation loss at the end is logged, and compared too.
RUN = {
    "trainer": {"steps": STEPS, "invariant": True},
    "optimizer": {"max_grad_norm": 0.25},
    "checkpoint": {"every_steps": 5},
    "data": {"validation_fraction": 0.1},
}
FSDP = ["--trainer.layout", "fsdp", "--trainer.min_shard", "1"]
# Weights split over 8 fsdp devices (the layout alone, on the default data-parallel mesh, splits nothing).
FSDP_8 = ["--trainer.mesh.fsdp", "8", "--trainer.mesh.data", "1"]
# 8 devices, each pair of data replicas holding its fsdp shard of the weights: a split of its own, and the mesh
# the killed run is written on (its `train` process loads the split's programs from the compilation cache).
DATA2_FSDP4 = ["--trainer.mesh.fsdp", "4", "--trainer.mesh.data", "2", *FSDP]
# The 8-device run is killed right after its step-5 checkpoint is complete (kill -9: no cleanup).
KILL_AT_5 = """
import os, signal, sys
from halyard.train.trainer.session import TrainingSession
from halyard.train.cli import train_main
save = TrainingSession.save
def save_then_die(self, step, state, **options):
    save(self, step, state, **options)
    if step == 5:
        self.manager.wait()
        os.kill(os.getpid(), signal.SIGKILL)
TrainingSession.save = save_then_die
sys.exit(train_main(sys.argv[1:]))
"""
ENV = dict(
    os.environ,
    XLA_FLAGS="--xla_force_host_platform_device_count=8 "
    + os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", ""),
    JAX_PLATFORMS="cpu",
)


def logged(run_dir: Path) -> list[tuple[Any, float]]:
    """(loss, grad_norm) of every step the run logged, in order, then ("eval", eval_loss) of its evaluations."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [(row["loss"], row["grad_norm"]) for row in rows if "loss" in row]
    return steps + [("eval", row["eval_loss"]) for row in rows if "eval_loss" in row]


def final_params(folder: Path) -> Any:
    """The parameters of the run's latest checkpoint, restored onto one device."""
    setup = RunSetup(load_config(folder / "run.yaml"), devices=jax.devices()[:1])
    abstract, shardings = setup.abstract_state
    return CheckpointManager(folder / "run" / "checkpoints").restore(None, abstract, shardings).state.params


def train(
    folder: Path, cache_dir: Path, devices: int, *args: str, native_isa: bool = False, **sections: Any
) -> Path:
    """``train`` of the invariant tiny run in a fresh process of ``devices`` devices; returns the run's folder.
    ``native_isa``: XLA_FLAGS without the tests' cap on the instruction set, as a user starts it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(folder / "run.yaml", folder / "run", cache_dir, **{**RUN, **sections})
    result = run_cli(["--config", str(config), *args], devices=devices, native_isa=native_isa)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fused multiply-adds" not in result.stdout, result.stdout[-2000:]
    return folder


def train_here(folder: Path, cache_dir: Path, devices: int, *args: str, **sections: Any) -> Path:
    """The same run trained in this process (`Trainer.fit`, what ``train`` runs) on the first ``devices`` of
    its 8 devices: no process start (imports, data, the CPU's peak) for each mesh. ``train`` in fresh
    processes trains the 1-device reference, the killed run, its resume on 2 processes, and the 2-process runs."""
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(folder / "run.yaml", folder / "run", cache_dir, **{**RUN, **sections})
    Trainer(load_config(config, *args), devices=jax.devices()[:devices]).fit()
    return folder


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One token cache for the file's runs in every test worker (its build lock lets one process build it)."""
    cache = run_root(tmp_path_factory) / "invariant-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The reference, started as a user starts `train`: with fused multiply-adds unless the command turns them
    off for trainer.invariant (XLA contracts a multiply and an add where both land in one fused loop, which
    differs between a 1-device and an 8-device program); the other runs are the tests' processes, without.
    Trained once per pytest run, by the first worker that needs it (the file's tests may span workers)."""
    fill = lambda folder: train(folder, cache_dir, 1, native_isa=True)
    return shared_folder(tmp_path_factory, "invariant-one-device", fill)[0]


@pytest.mark.parametrize(
    ("devices", "mesh"),
    [
        (2, []),
        (8, []),
        (4, ["--trainer.mesh.fsdp", "4", "--trainer.mesh.data", "1", *FSDP]),
        (8, DATA2_FSDP4),
    ],
    # data 4 and fsdp 2 ran the same code as data 2 / data 8 and fsdp 4 (a row count, a shard count apart)
    ids=["data2", "data8", "fsdp4", "data2_fsdp4"],
)
def test_every_split_logs_and_ends_bitwise_like_one_device(
    tmp_path: Path, cache_dir: Path, one_device: Path, devices: int, mesh: list[str]
) -> None:
    run = train_here(tmp_path, cache_dir, devices, *mesh)
    reference = logged(one_device / "run")
    assert len(reference) == STEPS + 1 and reference[-1][0] == "eval"
    assert all(norm > 0.25 for _, norm in reference[:STEPS])  # clipped every step
    assert logged(run / "run") == reference
    assert_bitwise_equal(final_params(run), final_params(one_device))


def test_killed_on_8_devices_and_resumed_on_2_devices_or_2_processes_equals_one_device(
    tmp_path: Path, cache_dir: Path, one_device: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN)
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT_5, "--config", str(config), *DATA2_FSDP4],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert len(logged(tmp_path / "run")) == 5
    # The same killed run, copied, resumes on 2 processes of 4 devices each, data 8: the two-process data 8
    # run's steps, eval and final parameters against the 1-device run (the fsdp 8 test below starts one).
    copy = tmp_path / "on_two_processes"
    shutil.copytree(tmp_path / "run", copy / "run")
    copied = write_config(copy / "run.yaml", copy / "run", cache_dir, **RUN)
    # Resumed on 2 of this process's devices (`Trainer.fit`, what ``train`` runs): the data 2 split's programs.
    Trainer(load_config(config), devices=jax.devices()[:2]).fit()
    note = (
        "resuming on data=2 (the checkpoint was written on data=2 x fsdp=4): "
        "trainer.invariant keeps every step bitwise"
    )
    assert note in capsys.readouterr().out
    assert logged(tmp_path / "run") == logged(one_device / "run")
    assert_bitwise_equal(final_params(tmp_path), final_params(one_device))
    for process in start_processes(["--config", str(copied), *FSDP], processes=2, devices=4):
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
    assert logged(copy / "run") == logged(one_device / "run")
    assert_bitwise_equal(final_params(copy), final_params(one_device))


def test_lion_on_8_devices_is_bitwise_like_one_device(tmp_path: Path, cache_dir: Path) -> None:
    lion = {"optimizer": {"type": "lion", "learning_rate": 0.001, "max_grad_norm": 0.25}}
    runs = [train_here(tmp_path / f"devices{n}", cache_dir, n, *FSDP, **lion) for n in (1, 8)]
    # and with the weights split over 8 fsdp devices, each layer gathered inside the scan
    runs.append(train_here(tmp_path / "fsdp8", cache_dir, 8, *FSDP, *FSDP_8, **lion))
    for run in runs[1:]:
        assert logged(runs[0] / "run") == logged(run / "run")
        assert_bitwise_equal(final_params(runs[0]), final_params(run))


def test_two_processes_of_four_devices_log_like_one_device(
    tmp_path: Path, cache_dir: Path, one_device: Path
) -> None:
    """fsdp 8 from step 0 (each process initialises its shards). Data 8 on two processes is the killed run's
    resume above: the same step program, checked for its 5 steps, the evaluation and the final parameters."""
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN)
    processes = start_processes(["--config", str(config), *FSDP, *FSDP_8], processes=2, devices=4)
    for process in processes:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
    assert logged(tmp_path / "run") == logged(one_device / "run")
    assert_bitwise_equal(final_params(tmp_path), final_params(one_device))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--optimizer.type", "muon"],
            "trainer.invariant=true covers optimizer.type adamw and lion, not muon",
        ),
        (["--trainer.mesh.tensor", "2"], "not trainer.mesh.tensor=2"),
        (["--trainer.invariant_slices", "6"], "trainer.invariant_slices=6: use a power of two"),
        (
            ["--trainer.invariant_slices", "2"],
            "trainer.invariant_slices: 2 slices a microbatch do not spread over 8",
        ),
    ],
    ids=["muon", "tensor", "not_a_power_of_two", "fewer_slices_than_devices"],
)
def test_what_the_invariant_step_does_not_cover_is_refused_in_one_line(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN)
    code, err = fails(capsys, ["train", "--config", str(config), *args])
    assert code != 0 and message in err, err
    shutil.rmtree(tmp_path / "run", ignore_errors=True)
