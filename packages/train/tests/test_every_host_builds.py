"""Who tokenizes while the trainer trains: on 2 processes each one tokenizes its share of the shards into
the one shared cache (no process waits for process 0 to tokenize everything); with ``data.builder: ray`` a
Ray cluster does. Either way the cache equals a one-process local build byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_fixtures import run_cli, start_processes, write_config

from halyard.data import TokenCache, build_cache


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.name.startswith(".build.lock")
    }


@pytest.mark.multiprocess
def test_two_processes_each_tokenize_half_of_the_shards_into_one_cache(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    config = write_config(
        tmp_path / "two.yaml",
        tmp_path / "two",
        cache_dir,
        data={"shuffle": "era", "era_windows": 16},
        trainer={"steps": 2, "mesh": {"data": 4}},
        checkpoint={"every_steps": None},
    )
    processes = start_processes(["--config", str(config)])
    try:
        outputs = [process.communicate(timeout=300) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
        assert "data: building the token cache in the background (4 of 8 shards on this process)" in stdout
    # Each process held the lock of its own share while it wrote its shards.
    tokens = cache_dir / "tokens"
    assert (tokens / ".build.lock.0-of-2").exists() and (tokens / ".build.lock.1-of-2").exists()
    assert not (tokens / ".build.lock").exists()
    _assert_equals_a_local_build(cache_dir, tmp_path / "one")


@pytest.mark.ray
def test_a_ray_build_from_the_trainer_config_equals_the_local_build(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    config = write_config(
        tmp_path / "ray.yaml",
        tmp_path / "ray",
        cache_dir,
        data={"builder": "ray", "num_workers": 2, "shuffle": "era", "era_windows": 16},
        trainer={"steps": 2},
        checkpoint={"every_steps": None},
    )
    done = run_cli(["--config", str(config)], devices=1, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data: building the token cache in the background (8 of 8 shards on this process)" in done.stdout
    assert "Started a local Ray instance" in done.stderr  # the shards were Ray tasks
    _assert_equals_a_local_build(cache_dir, tmp_path / "local")


def _assert_equals_a_local_build(cache_dir: Path, local: Path) -> None:
    tokens = cache_dir / "tokens"
    assert TokenCache.open(str(tokens)).is_finished
    corpus = sorted(str(path) for path in (cache_dir / "corpus").glob("*.jsonl"))
    single = build_cache(
        corpus,
        str(cache_dir / "corpus" / "tokenizer.json"),
        str(local),
        num_workers=0,
        progress=False,
        relative_to=str(cache_dir),  # as the trainer records a cache outside its run directory
    )
    assert isinstance(single, TokenCache) and single.is_finished
    assert _files(tokens) == _files(local)
