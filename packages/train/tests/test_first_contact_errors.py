"""Errors a new user meets end in one line naming the thing, exit 2 (bad input) or 1 (runtime), and no
traceback; config errors are found before any data is tokenized (issue 18)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from trainer_fixtures import fails, load_config, start_processes, write_config

from halyard.train.cli import main
from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import save_resolved_config


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-cache")


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from halyard.train.corpora.python_stdlib import write_python_stdlib_corpus
    from halyard.train.corpora.tokenizer import train_bpe_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    shards = write_python_stdlib_corpus(folder / "corpus", 30)
    return train_bpe_tokenizer(shards, folder / "tokenizer.json", 512)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The YAML of a 4-step run that has finished (checkpoints at steps 2 and 4); what it printed is in
    ``train.out`` beside it."""
    folder = tmp_path_factory.mktemp("finished")
    config = write_config(folder / "run.yaml", folder / "run", cache_dir, trainer={"steps": 4})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        assert main(["train", "--config", str(config)]) == 0
    (folder / "train.out").write_text(printed.getvalue())
    return config


def train(config: Path, *overrides: str) -> list[str]:
    return ["train", "--config", str(config), *overrides]


def sources_config(tmp_path: Path, source: str) -> Path:
    """A tiny run reading ``source`` (no builtin corpus, no tokenizer set)."""
    data = {"builtin_corpus": None, "sources": [source], "num_workers": 0}
    name = Path(source).stem.replace("*", "")
    return write_config(tmp_path / f"{name}.yaml", tmp_path / "run", tmp_path / "cache", data=data)


def test_sources_tokenizer_and_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_file: Path
) -> None:
    (tmp_path / "docs.jsonl").write_text(json.dumps({"body": "hello world"}) + "\n")
    (tmp_path / "notes.json").write_text("these are notes")
    config = sources_config(tmp_path, str(tmp_path / "docs.jsonl"))

    code, err = fails(capsys, train(config))
    assert code == 2 and "data.tokenizer is not set" in err

    code, err = fails(capsys, train(config, "--data.tokenizer", str(tmp_path / "notes.json")))
    assert code == 2 and "data.tokenizer" in err and "notes.json is not a tokenizer" in err

    code, err = fails(capsys, train(config, "--data.tokenizer", str(tmp_path / "absent")))
    assert code == 2 and "absent" in err and "does not exist" in err

    no_match = sources_config(tmp_path, str(tmp_path / "shards-*.jsonl"))
    code, err = fails(capsys, train(no_match, "--data.tokenizer", str(tokenizer_file)))
    assert code == 2 and "shards-*.jsonl" in err and "matches no file" in err and "data.sources" in err

    # Tokenized in a worker process: the error crosses the process boundary as the same one line.
    code, err = fails(
        capsys, train(config, "--data.tokenizer", str(tokenizer_file), "--data.num_workers", "1")
    )
    assert code == 2 and "docs.jsonl:1: text field 'text' not found" in err and "data.text_field" in err
    assert "RemoteTraceback" not in err


def test_halyard_cache_reports_a_source_matching_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_file: Path
) -> None:
    argv = ["cache", "build", "--source", str(tmp_path / "none-*.jsonl"), "--tokenizer", str(tokenizer_file)]
    code, err = fails(capsys, [*argv, "--out", str(tmp_path / "cache")])
    assert code == 2 and "none-*.jsonl" in err and "matches no file" in err


def test_a_config_error_is_reported_before_any_cache_file_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache")
    code, err = fails(capsys, train(config, "--optimizer.schedule.warmup", "50"))
    assert code == 2 and "optimizer.schedule.warmup=50 is 50 steps, more than trainer.steps=6" in err
    code, err = fails(capsys, train(config, "--checkpoint.every_steps", "-1"))
    assert code == 2 and "checkpoint" in err and "every_steps" in err and "-1" in err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_mesh_layout_and_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert jax.device_count() == 8
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache")
    code, err = fails(capsys, train(config, "--trainer.mesh.tensor", "3"))
    assert code == 2 and err.startswith("error: trainer.mesh:") and "tensor=3" in err

    # 4 heads and a 64-wide MLP do not divide over tensor=8: too much of the model stays replicated.
    tensor = ["--trainer.layout", "tensor_parallel", "--trainer.mesh.data", "1", "--trainer.mesh.tensor", "8"]
    code, err = fails(capsys, train(config, *tensor, "--trainer.min_shard", "1"))
    assert code == 2 and "trainer.layout=tensor_parallel" in err and "replicated" in err

    code, err = fails(capsys, train(config, "--trainer.batch_size", "12"))
    assert code == 2 and "trainer.batch_size=12" in err and "data=8" in err and "multiple of 8" in err
    assert not (tmp_path / "cache").exists()


def test_hf_folder_without_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache")
    (tmp_path / "hf").mkdir()
    code, err = fails(capsys, train(config, "--trainer.init", f"hf:{tmp_path / 'hf'}"))
    assert code == 2 and f"trainer.init=hf:{tmp_path / 'hf'}" in err and "config.json does not exist" in err


def test_checkpoints_missing_damaged_and_of_other_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], finished_run: Path, cache_dir: Path
) -> None:
    fresh = write_config(tmp_path / "fresh.yaml", tmp_path / "fresh", cache_dir, trainer={"steps": 2})
    code, err = fails(capsys, train(fresh, "--trainer.init", "resume"))
    assert code == 2 and "trainer.init=resume" in err and "no complete checkpoint" in err
    code, err = fails(capsys, train(fresh, "--trainer.init", f"checkpoint:{tmp_path / 'nowhere'}"))
    assert code == 2 and "nowhere does not exist" in err
    assert not (tmp_path / "fresh").exists()

    # A run folder with its config but no checkpoint: the run tools say so.
    save_resolved_config(load_config(fresh), tmp_path / "fresh")
    code, err = fails(capsys, ["generate", "--run", str(tmp_path / "fresh"), "--prompt", "def "])
    assert code == 2 and "No complete checkpoint" in err and "fresh" in err

    # The finished run, continued with another batch size: its checkpoint is for other data.
    code, err = fails(capsys, train(finished_run, "--trainer.steps", "6", "--trainer.batch_size", "16"))
    assert code == 2 and "written for different data" in err and "batch_size" in err
    assert "trainer.init=checkpoint:" in err

    source = finished_run.parent / "run" / "checkpoints" / "step_00000002"
    damaged = tmp_path / "damaged" / "step_00000002"
    shutil.copytree(source, damaged)
    victim = max((p for p in damaged.rglob("*") if p.is_file() and "array" in str(p)), key=os.path.getsize)
    victim.write_bytes(b"\0" * victim.stat().st_size)
    code, err = fails(capsys, train(fresh, "--trainer.init", f"checkpoint:{damaged}"))
    assert code == 1 and "damaged" in err and str(damaged) in err


def test_what_a_run_prints_is_true(finished_run: Path) -> None:
    printed = (finished_run.parent / "train.out").read_text()
    # data.shuffle=feistel (the default) permutes the whole cache: the first step waits for all of it.
    assert "the first step waits for the whole cache (data.shuffle=feistel" in printed, printed
    assert "as soon as its first batches" not in printed
    peak = re.search(r"MFU is measured against cpu float32 peak ([\d.]+) ([kMGTP]?FLOP/s)", printed)
    assert peak is not None, printed
    assert 1 <= float(peak[1]) < 1000, peak[0]  # a unit that suits the number (not "0.0 TFLOP/s")


def test_export_and_generate_name_their_own_options_and_the_steps_there_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], finished_run: Path
) -> None:
    run = finished_run.parent / "run"
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("{}")
    code, err = fails(capsys, ["export", "--run", str(run), "--out", str(out)])
    assert code == 2 and f"--out {out} already holds a model" in err and "pass --overwrite" in err
    assert "overwrite=True" not in err and [path.name for path in out.iterdir()] == ["config.json"]

    code, err = fails(capsys, ["generate", "--run", str(run), "--step", "7", "--prompt", "def "])
    assert err == f"error: --step 7: no checkpoint at step 7 in {run}; available: 2, 4" and code == 2


def test_cache_info_reads_the_folder_data_cache_dir_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], finished_run: Path, cache_dir: Path
) -> None:
    # The documented default of data.cache_dir is <run_dir>/cache; the token cache is in its tokens/.
    assert main(["cache", "info", str(cache_dir)]) == 0
    assert "documents: 30" in capsys.readouterr().out
    code, err = fails(capsys, ["cache", "info", str(tmp_path)])
    assert code == 2 and f"no token cache in {tmp_path}" in err


def test_generate_separates_several_samples_and_shows_its_defaults(
    capsys: pytest.CaptureFixture[str], finished_run: Path
) -> None:
    prompts = ["--prompt", "def ", "--prompt", "class "]
    assert (
        main(["generate", "--run", str(finished_run.parent / "run"), *prompts, "--max-new-tokens", "4"]) == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("--- prompt 1 of 2 ---\ndef ") and "\n--- prompt 2 of 2 ---\nclass " in out, out
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "(default: 64)" in capsys.readouterr().out


def test_a_damaged_checkpoint_is_one_line_and_the_run_falls_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], finished_run: Path, cache_dir: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run.parent / "run", run)
    step_4 = run / "checkpoints" / "step_00000004"
    victim = max((p for p in step_4.rglob("*") if p.is_file() and "array" in str(p)), key=os.path.getsize)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, other content
    victim.write_bytes(bytes(data))
    config = write_config(tmp_path / "run.yaml", run, cache_dir, trainer={"steps": 6})
    capsys.readouterr()
    assert main(train(config)) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "step 4" in line or "step_0" in line]
    assert lines and all(line.startswith("warning: checkpoint step 4") for line in lines), lines
    found, saved = lines
    assert str(victim.relative_to(step_4)) in found and "failed its xxh3_64 checksum" in found
    assert "fell back to step 2" in found and "interrupted" not in saved and "damaged" in saved


def test_a_cache_built_for_other_data_gives_advice_train_can_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], finished_run: Path, cache_dir: Path
) -> None:
    shutil.copytree(cache_dir, tmp_path / "cache")
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache")
    code, err = fails(capsys, train(config, "--data.text_field", "body"))
    assert code == 2 and "text_field: 'text' -> 'body'" in err and "rebuild" not in err
    assert f"delete {tmp_path / 'cache' / 'tokens'}" in err and "data.cache_dir" in err


def test_out_of_memory_names_the_knobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # XLA's own error, as the compiler raises it for a step that does not fit (no CPU run can).
    def exhausted(*args: object, **kwargs: object) -> object:
        def step(state: object, batch: object, frozen: object = None) -> object:
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 81.50GiB.\nBufferAssignment..."
            )

        return step

    monkeypatch.setattr("halyard.train.run.setup.make_train_step", exhausted)
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, trainer={"steps": 2})
    code, err = fails(capsys, train(config))
    assert code == 1 and "out of device memory while compiling or running train step 1" in err
    assert "81.50GiB" in err
    for knob in ("trainer.batch_size=8", "trainer.accumulation", "model.remat", "trainer.layout"):
        assert knob in err


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache")
    with pytest.raises(ConfigError, match="warmup"):
        main(["--debug", *train(config, "--optimizer.schedule.warmup", "50")])
    monkeypatch.setenv("HALYARD_DEBUG", "1")
    with pytest.raises(ConfigError, match="warmup"):
        main(train(config, "--optimizer.schedule.warmup", "50"))


def test_the_train_command_prints_no_traceback_but_does_with_halyard_debug(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    (tmp_path / "docs.jsonl").write_text(json.dumps({"body": "hello world"}) + "\n")
    config = sources_config(tmp_path, str(tmp_path / "docs.jsonl"))
    args = ["--config", str(config), "--data.tokenizer", str(tokenizer_file), "--data.num_workers", "1"]
    code = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    for debug in ("0", "1"):
        env = dict(os.environ, HALYARD_DEBUG=debug, JAX_PLATFORMS="cpu")
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env
        )
        if debug == "0":
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr
            lines = done.stderr.strip().splitlines()
            assert [line for line in lines if line.startswith("error: ")] == lines[-1:]
            assert "docs.jsonl:1: text field 'text' not found" in lines[-1]
        else:
            assert done.returncode == 1 and "Traceback" in done.stderr and "MissingFieldError" in done.stderr


@pytest.mark.multiprocess
def test_a_data_error_on_process_0_stops_every_process(tmp_path: Path, tokenizer_file: Path) -> None:
    config = sources_config(tmp_path, str(tmp_path / "none-*.jsonl"))
    processes = start_processes(["--config", str(config), "--data.tokenizer", str(tokenizer_file)])
    try:
        outputs = [process.communicate(timeout=240) for process in processes]  # hung before: no timeout
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    (_, first), (_, second) = outputs
    assert processes[0].returncode == 2 and "none-*.jsonl" in first and "matches no file" in first
    assert processes[1].returncode == 1 and "process 0 stopped while preparing the data" in second
    assert "Traceback" not in first + second
