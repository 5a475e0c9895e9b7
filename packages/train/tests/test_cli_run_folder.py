"""``train`` on bad input leaves no half-made run folder (an empty corpus, a run folder that cannot be made:
one ``error:`` line, exit 2), and ``train`` on a finished run says so and writes nothing (issue 34)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from trainer_fixtures import fails, write_config

from halyard.train.cli import main
from halyard.train.corpora.python_stdlib import write_python_stdlib_corpus
from halyard.train.corpora.tokenizer import train_bpe_tokenizer


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    shards = write_python_stdlib_corpus(folder / "corpus", 30)
    return train_bpe_tokenizer(shards, folder / "tokenizer.json", 512)


def corpus_config(tmp_path: Path, tokenizer_file: Path, text: str) -> tuple[Path, Path]:
    """A tiny run on one jsonl file holding ``text`` (no file when empty), its cache inside the run folder."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": text}) + "\n" if text else "")
    run_dir = tmp_path / "run"
    data = {
        "builtin_corpus": None,
        "sources": [str(corpus)],
        "tokenizer": str(tokenizer_file),
        "cache_dir": None,
    }
    return write_config(tmp_path / "run.yaml", run_dir, tmp_path / "unused", data=data), run_dir


def test_an_empty_corpus_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_file: Path
) -> None:
    config, run_dir = corpus_config(tmp_path, tokenizer_file, "")
    code, err = fails(capsys, ["train", "--config", str(config)])
    assert code == 2 and "data.sources: every file is empty" in err and "corpus.jsonl" in err
    assert not run_dir.exists()


def test_a_corpus_too_small_for_one_example_leaves_no_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_file: Path
) -> None:
    config, run_dir = corpus_config(tmp_path, tokenizer_file, "x = 1")  # a few tokens, seq_len is 32
    code, err = fails(capsys, ["train", "--config", str(config)])
    assert code == 2 and "not one window of seq_len + 1 = 33 tokens" in err, err
    assert "data.sources (more text) or data.seq_len" in err
    assert not run_dir.exists()  # no cache/, checkpoints/, config.yaml or metrics.jsonl


def test_a_run_folder_under_a_file_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    config = write_config(tmp_path / "run.yaml", blocker / "run", tmp_path / "cache")
    code, err = fails(capsys, ["train", "--config", str(config)])
    assert code == 2 and f"trainer.run_dir={blocker / 'run'}: cannot create the run folder" in err
    assert "Not a directory" in err
    assert blocker.read_text() == "a file, not a folder"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_run_folder_without_permission_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        config = write_config(tmp_path / "run.yaml", locked / "run", tmp_path / "cache")
        code, err = fails(capsys, ["train", "--config", str(config)])
    finally:
        locked.chmod(0o700)
    assert code == 2 and "cannot create the run folder" in err and "Permission denied" in err


def test_a_finished_run_says_so_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        run_dir,
        tmp_path / "cache",
        data={"validation_fraction": 0.1},
        trainer={"steps": 2, "eval_batches": 1},
    )
    assert main(["train", "--config", str(config)]) == 0
    before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")}
    metrics = (run_dir / "metrics.jsonl").read_text()
    capsys.readouterr()

    assert main(["train", "--config", str(config)]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == (
        f"{run_dir} is finished: its latest checkpoint is step 2 (trainer.steps=2); nothing to do. Raise "
        "trainer.steps to train it further"
    )
    assert out.err == ""
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # no second eval record for step 2
    assert {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")} == before
