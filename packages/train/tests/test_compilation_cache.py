"""trainer.compilation_cache: a second start of a run loads its compiled programs from disk, with the same
results; a cache folder set already (JAX_COMPILATION_CACHE_DIR) is kept."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest
from trainer_fixtures import run_cli, write_config

from halyard.shard.compilation_cache import use_compilation_cache


def _losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [record["loss"] for record in records if "loss" in record]


def _summary(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "metrics.summary.json").read_text())


def test_a_second_run_loads_its_programs_from_the_cache_and_trains_the_same_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)  # the suite's own cache folder
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # keep even tiny programs
    cache = tmp_path / "jax-cache"
    runs = []
    for name in ("first", "second"):  # a new run dir each time: the second does not resume the first
        config = write_config(
            tmp_path / f"{name}.yaml",
            tmp_path / name,
            tmp_path / "data",
            trainer={"steps": 3, "compilation_cache": str(cache)},
            checkpoint={"every_steps": None},
        )
        completed = run_cli(["--config", str(config)], devices=1)
        assert completed.returncode == 0, completed.stderr[-3000:]
        runs.append(completed.stdout)
    first, second = _summary(tmp_path / "first"), _summary(tmp_path / "second")
    assert first["compilation_cache/programs_loaded"] == 0
    assert first["compilation_cache/programs_compiled"] >= 2  # the state's initialisation and the step
    assert second["compilation_cache/programs_loaded"] >= 2
    assert second["compilation_cache/programs_compiled"] == 0
    assert (
        f"compilation cache: 0 of {first['compilation_cache/programs_compiled']:.0f} programs loaded from {cache}"
        in runs[0]
    )
    assert any(cache.iterdir())
    assert _losses(tmp_path / "second") == _losses(tmp_path / "first")


def test_a_cache_folder_set_already_is_kept() -> None:
    current = jax.config.jax_compilation_cache_dir  # the suite sets JAX_COMPILATION_CACHE_DIR (conftest)
    assert current
    assert use_compilation_cache("/elsewhere/halyard-cache") == current
    assert jax.config.jax_compilation_cache_dir == current
