"""Context parallelism through `train`: a sequence split over ``trainer.mesh.sequence`` gives the 1-device
run's losses within float tolerance (ring on sequence 4 x data 2; all_gather on sequence 2 x fsdp 2 x
tensor 2; ulysses on sequence 2 x data 4; 2 processes whose sequence axis spans both), resumes bitwise on
its own mesh, restores onto a mesh without a sequence split, and refuses in one line what cannot split.
The built-in long-context config plans to fit Llama 3.1 8B at 128k tokens on 8 H200s and trains from a
Hugging Face folder at smoke size."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from trainer_fixtures import (
    TINY,
    StopAfter,
    assert_bitwise_equal,
    assert_trajectory_close,
    fails,
    load_config,
    one_device_run,
    run_losses,
    save_tiny_hf_llama,
    start_processes,
    write_config,
)

from halyard.models.attention import dispatch
from halyard.models.attention.context_parallel import choose_context_parallel
from halyard.train.checkpoint.layout import step_directory
from halyard.train.cli import main, train_main
from halyard.train.trainer.trainer import Trainer

STEPS = 10  # two checkpoints (at HALF and STEPS) to resume and move from; a wrong split parts by step 2
HALF = STEPS // 2  # the checkpoint a run resumes from, or moves to a mesh without the split from
RUN = {"trainer": {"steps": STEPS}, "checkpoint": {"every_steps": HALF}}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-cache")


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> list[float]:
    return run_losses(one_device_run(tmp_path_factory.mktemp("one_device"), cache_dir, **RUN))


RING = ["--trainer.mesh.sequence", "4", "--model.context_parallel", "ring"]


def train_recording(config: Path, mesh: list[str]) -> list[tuple[str, int]]:
    """`train_main` of ``config`` on ``mesh`` in this process; the (implementation, devices) of every
    context-parallel attention it traced."""
    traced: list[tuple[str, int]] = []
    real = dispatch.context_parallel_attention

    def recording(flat, split, *, implementation, **kwargs):  # type: ignore[no-untyped-def]
        chosen = choose_context_parallel(flat, split) if implementation == "auto" else implementation
        traced.append((chosen, split.size))
        return real(flat, split, implementation=implementation, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dispatch, "context_parallel_attention", recording)
        assert train_main(["--config", str(config), *mesh]) == 0
    return traced


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, list[tuple[str, int]]]:
    """The run split over ring sequence 4 x data 2, trained through `train` (checkpoints at 5 and 10): its
    folder and what it traced. The ring split's test checks it, the resume test resumes to its bits."""
    folder = tmp_path_factory.mktemp("ring")
    config = write_config(folder / "run.yaml", folder / "run", cache_dir, **RUN)
    return folder / "run", train_recording(config, RING)


@pytest.mark.parametrize(
    "mesh",
    [
        RING,
        ["--trainer.mesh.sequence", "2", "--trainer.mesh.fsdp", "2", "--trainer.mesh.tensor", "2",
         "--trainer.mesh.data", "1", "--trainer.layout", "fsdp_tensor", "--trainer.min_shard", "1"],
        ["--trainer.mesh.sequence", "2", "--model.context_parallel", "ulysses"],
    ],
    ids=["ring_sequence4_data2", "all_gather_sequence2_fsdp2_tensor2", "ulysses_sequence2_data4"],
)  # fmt: skip
def test_a_split_sequence_trains_like_one_device(
    tmp_path: Path, cache_dir: Path, one_device: list[float], mesh: list[str], request: pytest.FixtureRequest
) -> None:
    if mesh == RING:
        run_dir, traced = request.getfixturevalue("ring_run")
    else:
        run_dir = tmp_path / "run"
        traced = train_recording(write_config(tmp_path / "run.yaml", run_dir, cache_dir, **RUN), mesh)
    implementation, size = request.node.callspec.id.split("_sequence")[0], int(mesh[1])
    assert traced and set(traced) == {(implementation, size)}, traced
    split = run_losses(run_dir)
    assert len(split) == len(one_device) == STEPS
    assert_trajectory_close(split, one_device)
    assert split[-1] < split[0]


def test_a_context_parallel_run_resumes_bitwise_and_restores_without_the_split(
    tmp_path: Path, cache_dir: Path, one_device: list[float], ring_run: tuple[Path, list[tuple[str, int]]]
) -> None:
    whole = ring_run[0]
    reference = Trainer(load_config(whole.parent / "run.yaml", *RING)).restore_state(STEPS)
    split = load_config(write_config(tmp_path / "split.yaml", tmp_path / "split", cache_dir, **RUN), *RING)
    with pytest.raises(SystemExit):
        Trainer(split, preemption=StopAfter(HALF)).fit()
    resumed = Trainer(split).fit()
    assert_bitwise_equal(reference.params, resumed.state.params)
    assert [h["loss"] for h in resumed.history] == run_losses(whole)[HALF:]
    # The step-5 checkpoint on a mesh without a sequence split (8 data-parallel devices).
    moved = write_config(tmp_path / "moved.yaml", tmp_path / "moved", cache_dir, **RUN)
    checkpoint = step_directory(tmp_path / "split" / "checkpoints", HALF)
    assert checkpoint.is_dir(), sorted(p.name for p in checkpoint.parent.iterdir())
    assert train_main(["--config", str(moved), "--trainer.init", f"checkpoint:{checkpoint}"]) == 0
    # the ring run's checkpoint took its 5 updates on another mesh than the reference's
    assert_trajectory_close(run_losses(tmp_path / "moved"), one_device[HALF:], updates_before=HALF)


def test_what_cannot_split_is_refused_in_one_line(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir))
    code, err = fails(
        capsys, ["train", "--config", config, "--trainer.mesh.sequence", "4", "--data.seq_len", "36"]
    )
    assert code == 2 and "data.seq_len=36" in err and "multiple of 8" in err
    code, err = fails(
        capsys,
        ["train", "--config", config, "--trainer.mesh.sequence", "4", "--model.context_parallel", "ulysses"],
    )
    assert code == 2 and "model.context_parallel=ulysses" in err and "kv heads (2)" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.multiprocess
def test_a_sequence_split_across_two_processes_trains_like_one_device(
    tmp_path: Path, cache_dir: Path, one_device: list[float]
) -> None:
    # 2 processes x 2 devices, all 4 on the sequence axis: every attention's ring or gather crosses them.
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN)
    mesh = ["--trainer.mesh.sequence", "4", "--trainer.mesh.data", "1", "--model.context_parallel", "ring"]
    processes = start_processes(["--config", str(config), *mesh])
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-3000:]
    assert_trajectory_close(run_losses(tmp_path / "run"), one_device)


LLAMA_31_8B = Path(__file__).resolve().parents[2] / "export" / "tests" / "fixtures" / "hf-configs" / "llama"


def test_the_long_context_config_fits_128k_tokens_of_llama_8b_on_8_h200(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "Llama-3.1-8B"  # the published config.json: shapes and RoPE scaling, no weights
    folder.mkdir()
    shutil.copy(LLAMA_31_8B / "Llama-3.1-8B.json", folder / "config.json")
    argv = ["plan", "--config", "llama-8b-128k", "--accelerator", "H200", "--trainer.init", f"hf:{folder}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "8 devices (mesh sequence=8)" in out and "131,072 tokens a step" not in out
    assert "8 x 131072 = 1,048,576 tokens a step, accumulation 8" in out
    assert "fits on H200" in out, out
    # One sequence a device, the batch split 8 ways instead: 126 GiB of activations, and the advice says why.
    assert main([*argv, "--trainer.mesh.sequence", "1", "--trainer.accumulation", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "DOES NOT FIT on H200" in out
        and "split each sequence over more devices (trainer.mesh.sequence)" in out
    )


def test_the_long_context_config_trains_from_a_hugging_face_folder(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # At smoke size: the tiny Llama's folder, 64-token sequences split over 4 devices x fsdp 2, trained by
    # `train_main` in this process (what `train` runs), on its 8 devices: no process start.
    hf = save_tiny_hf_llama(tmp_path / "hf")
    data = TINY["data"] | {"cache_dir": str(cache_dir), "seq_len": 64, "validation_fraction": 0}
    argv = [
        "--config",
        "llama-8b-128k",
        "--trainer.init",
        f"hf:{hf}",
        "--trainer.run_dir",
        str(tmp_path / "run"),
    ]
    argv += [f"--data.{key}={value}" for key, value in data.items()] + ["--data.sources", "[]"]
    argv += ["--trainer.mesh.sequence", "4", "--trainer.batch_size", "4", "--trainer.accumulation", "2"]
    argv += ["--trainer.steps", "2", "--trainer.progress", "false", "--trainer.min_shard", "0"]
    argv += ["--trainer.eval_every", "0", "--checkpoint.every_steps", "2", "--trainer.plot", "false"]
    assert train_main(argv) == 0
    out = capsys.readouterr().out
    assert "finished at step 2" in out, out[-2000:]
    assert len(run_losses(tmp_path / "run")) == 2
