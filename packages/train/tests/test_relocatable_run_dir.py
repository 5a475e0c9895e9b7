"""A run directory (its corpus, token cache and checkpoints inside it) moved to another path resumes there,
reusing its cache, to the bits of a run that never moved; so does one whose corpus lay outside it and moved
too (the cache knows such files by their size and leading bytes)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from trainer_fixtures import StopAfter, assert_bitwise_equal, load_config, write_config

from halyard.train.corpora.python_stdlib import write_python_stdlib_corpus
from halyard.train.corpora.tokenizer import train_bpe_tokenizer
from halyard.train.trainer.trainer import Trainer


def test_a_moved_run_directory_resumes_with_its_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sections = {"data": {"cache_dir": None}, "trainer": {"steps": 4}, "checkpoint": {"every_steps": None}}
    first = write_config(tmp_path / "first.yaml", tmp_path / "first", tmp_path, **sections)
    with pytest.raises(SystemExit):  # preempted after step 2: a checkpoint at step 2
        Trainer(load_config(first), preemption=StopAfter(2)).fit()
    moved = tmp_path / "elsewhere" / "run"
    shutil.move(tmp_path / "first", moved)
    capsys.readouterr()
    resumed = Trainer(load_config(first, "--trainer.run_dir", str(moved))).fit()
    assert resumed.history[0]["step"] == 3
    assert "building the token cache" not in capsys.readouterr().out  # the moved cache was reused
    reference = Trainer(
        load_config(write_config(tmp_path / "ref.yaml", tmp_path / "ref", tmp_path, **sections))
    ).fit()
    assert_bitwise_equal(reference.state.params, resumed.state.params)


def test_sources_outside_the_run_directory_moved_with_it_resume_and_reuse_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run dir moves, and so do its corpus and tokenizer, which lay outside it (another disk): the
    cache knows the corpus by content, so the resumed run reuses it and has the reference's bits."""
    disk = tmp_path / "disk1"
    shards = write_python_stdlib_corpus(disk / "corpus", 8)
    train_bpe_tokenizer(shards, disk / "tokenizer.json", 512)

    def sections(root: Path) -> dict[str, Any]:
        data = {
            "builtin_corpus": None,
            "sources": [str(root / "corpus" / "*.jsonl")],
            "tokenizer": str(root / "tokenizer.json"),
        }
        return {
            "data": {**data, "cache_dir": None},
            "trainer": {"steps": 4},
            "checkpoint": {"every_steps": None},
        }

    first = write_config(tmp_path / "first.yaml", tmp_path / "first", tmp_path, **sections(disk))
    with pytest.raises(SystemExit):  # preempted after step 2: a checkpoint at step 2
        Trainer(load_config(first), preemption=StopAfter(2)).fit()
    shutil.move(tmp_path / "first", tmp_path / "elsewhere")
    shutil.move(disk, tmp_path / "disk2")
    capsys.readouterr()
    moved = write_config(
        tmp_path / "moved.yaml", tmp_path / "elsewhere", tmp_path, **sections(tmp_path / "disk2")
    )
    resumed = Trainer(load_config(moved)).fit()
    assert resumed.history[0]["step"] == 3
    shown = capsys.readouterr()
    assert "building the token cache" not in shown.out and "moved (same size and leading bytes)" in shown.err
    shutil.copytree(tmp_path / "disk2", disk)
    reference = Trainer(
        load_config(write_config(tmp_path / "ref.yaml", tmp_path / "ref", tmp_path, **sections(disk)))
    ).fit()
    assert_bitwise_equal(reference.state.params, resumed.state.params)
