"""Pipeline parallelism through `train`: a layer stack pipelined over ``trainer.mesh.stage`` gives the
1-device run's losses within float tolerance (stage 2 x data 4; stage 4 x data 2; stage 2 x fsdp 2 x tensor 2
with 2 repeats; 2 processes whose 4-device stage axis spans both), resumes bitwise on its own mesh, moves
between meshes with and without a pipeline (the checkpoint is the same tree), and refuses in one line what
cannot pipeline. The model has 4 layers so that 4 stages, or 2 stages x 2 repeats, cut it."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_fixtures import (
    StopAfter,
    assert_bitwise_equal,
    assert_trajectory_close,
    fails,
    load_config,
    one_device_run,
    run_losses,
    start_processes,
    write_config,
)

from halyard.train.checkpoint.layout import step_directory
from halyard.train.cli import main, train_main
from halyard.train.trainer.trainer import Trainer

STEPS = 10  # two checkpoints (at HALF and STEPS) to resume and move from; a mesh that computes wrong parts by step 2
HALF = STEPS // 2  # the checkpoint a run resumes from, or moves to another mesh from
RUN = {
    "model": {"num_layers": 4},
    "trainer": {"steps": STEPS, "min_shard": 1},
    "checkpoint": {"every_steps": HALF},
}
STAGE2 = ["--trainer.mesh.stage", "2", "--model.pipeline_microbatches", "2"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-cache")


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    return one_device_run(tmp_path_factory.mktemp("one_device"), cache_dir, **RUN)


@pytest.fixture(scope="module")
def stage2_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The run pipelined over stage 2 x data 4, trained through `train` (checkpoints at 5 and 10)."""
    folder = tmp_path_factory.mktemp("stage2")
    config = write_config(folder / "run.yaml", folder / "run", cache_dir, **RUN)
    assert train_main(["--config", str(config), *STAGE2]) == 0
    return folder / "run"


def test_a_run_pipelined_over_two_stages_trains_like_one_device(stage2_run: Path, one_device: Path) -> None:
    pipelined = run_losses(stage2_run)
    assert_trajectory_close(pipelined, run_losses(one_device), model=RUN["model"])
    assert pipelined[-1] < pipelined[0]


@pytest.mark.parametrize(
    "mesh",
    [
        ["--trainer.mesh.stage", "4", "--model.pipeline_microbatches", "4"],
        [*STAGE2, "--model.pipeline_repeats", "2", "--trainer.mesh.fsdp", "2", "--trainer.mesh.tensor", "2",
         "--trainer.mesh.data", "1", "--trainer.layout", "fsdp_tensor", "--trainer.min_shard", "1"],
    ],
    ids=["stage4_data2", "stage2_repeats2_fsdp2_tensor2"],
)  # fmt: skip
def test_a_pipelined_run_trains_like_one_device(
    tmp_path: Path, cache_dir: Path, one_device: Path, mesh: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN)
    assert train_main(["--config", str(config), *mesh]) == 0
    pipelined = run_losses(tmp_path / "run")
    assert_trajectory_close(pipelined, run_losses(one_device), model=RUN["model"])
    assert pipelined[-1] < pipelined[0]


def test_a_pipelined_run_resumes_bitwise_and_moves_to_and_from_a_mesh_without_stages(
    tmp_path: Path, cache_dir: Path, one_device: Path, stage2_run: Path
) -> None:
    reference = Trainer(load_config(stage2_run.parent / "run.yaml", *STAGE2)).restore_state(STEPS)
    split = load_config(write_config(tmp_path / "split.yaml", tmp_path / "split", cache_dir, **RUN), *STAGE2)
    with pytest.raises(SystemExit):
        Trainer(split, preemption=StopAfter(HALF)).fit()
    resumed = Trainer(split).fit()
    assert_bitwise_equal(reference.params, resumed.state.params)
    assert [h["loss"] for h in resumed.history] == run_losses(stage2_run)[HALF:]
    expected = run_losses(one_device)[HALF:]
    # The pipelined step-5 checkpoint on 8 data-parallel devices, and the 1-device one pipelined.
    # (the pipelined run's checkpoint took its 5 updates on another mesh than the reference's)
    for name, source, mesh, updates_before in (
        ("unpipelined", tmp_path / "split", [], HALF),
        ("pipelined", one_device, STAGE2, 0),
    ):
        checkpoint = step_directory(source / "checkpoints", HALF)
        moved = write_config(tmp_path / f"{name}.yaml", tmp_path / name, cache_dir, **RUN)
        assert train_main(["--config", str(moved), "--trainer.init", f"checkpoint:{checkpoint}", *mesh]) == 0
        losses = run_losses(tmp_path / name)
        assert_trajectory_close(losses, expected, model=RUN["model"], updates_before=updates_before)


@pytest.mark.multiprocess
def test_a_pipeline_across_two_processes_trains_like_one_device(
    tmp_path: Path, cache_dir: Path, one_device: Path
) -> None:
    # 2 processes x 2 devices, all 4 on the stage axis: activations pass between the processes.
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN)
    mesh = ["--trainer.mesh.stage", "4", "--trainer.mesh.data", "1", "--model.pipeline_microbatches", "4"]
    processes = start_processes(["--config", str(config), *mesh])
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-3000:]
    assert_trajectory_close(run_losses(tmp_path / "run"), run_losses(one_device), model=RUN["model"])


def test_what_cannot_pipeline_is_refused_in_one_line(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN))
    train = ["train", "--config", config, "--trainer.mesh.stage"]
    code, err = fails(
        capsys, [*train, "4", "--model.pipeline_microbatches", "4", "--model.pipeline_repeats", "2"]
    )
    assert (
        code == 2
        and "model.num_layers=4 does not cut into trainer.mesh.stage=4 x model.pipeline_repeats=2" in err
    )
    code, err = fails(capsys, [*train, "2"])
    assert code == 2 and "model.pipeline_microbatches=1 is fewer than the trainer.mesh.stage=2 stages" in err
    code, err = fails(capsys, [*train, "2", "--model.pipeline_microbatches", "4"])
    assert code == 2 and "trainer.batch_size=8" in err and "model.pipeline_microbatches=4" in err
    assert "multiple of 16" in err
    assert not (tmp_path / "run").exists()


def test_plan_reports_the_pipeline_and_its_bubble(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", **RUN))
    assert main(["plan", "--config", config, "--devices", "8", *STAGE2]) == 0
    out = capsys.readouterr().out
    assert "pipeline  2 stages x 1 repeats, 2 microbatches: 3 iterations, bubble 33.3%" in out, out


def test_llama_70b_fits_64_devices_only_with_its_pipeline(capfd: pytest.CaptureFixture[str]) -> None:
    # 8 tensor-parallel nodes: as 8 pipeline stages each node holds 10 layers; without stages, all 80.
    # (capfd: a process whose jax already has 8 devices plans 64 in a subprocess, which writes to the fd)
    assert main(["plan", "--config", "llama-70b", "--devices", "64"]) == 0
    out = capfd.readouterr().out
    assert "mesh stage=8 tensor=8" in out and "bubble 30.4%" in out and "fits on H100 SXM" in out, out
    assert main(["plan", "--config", "llama-70b", "--devices", "64", "--trainer.mesh.stage", "1",
                 "--trainer.mesh.data", "8"]) == 0  # fmt: skip
    out = capfd.readouterr().out
    assert "mesh data=8 tensor=8" in out and "DOES NOT FIT on H100 SXM" in out, out
