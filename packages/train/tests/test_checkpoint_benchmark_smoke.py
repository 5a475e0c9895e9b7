"""The checkpoint benchmark script runs end to end in --quick mode and writes its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "checkpoints" / "checkpoint_save.py"


def test_checkpoint_benchmark_quick_mode(tmp_path: Path) -> None:
    output = tmp_path / "checkpoint_save.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", ""),
        },
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "bandwidth ratio checkpoint/raw" in completed.stdout
    result = json.loads(output.read_text())
    assert result["quick"] is True
    assert result["state_bytes"] == 3 * 4 * result["num_parameters"]
    assert result["checkpoint_to_raw_bandwidth_ratio"] > 0
    assert result["async_stall_fraction_of_sync_save"] >= 0
    # the plain-write baselines ran at both call sizes, and the fresh-memory probe timed both touches
    assert set(result["plain_write_by_bytes_per_call"]) == {str(16 * 2**20), str(256 * 2**10)}
    assert all(
        row["step_slowdown_during_write"] > 0 for row in result["plain_write_by_bytes_per_call"].values()
    )
    assert all(seconds > 0 for seconds in result["fresh_memory_seconds"].values())
    assert "steps during a plain write of the same bytes in 0.25 MiB calls" in completed.stdout
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint_save.json"]  # cleaned up after itself


def test_checksum_benchmark_quick_mode(tmp_path: Path) -> None:
    script = SCRIPT.with_name("checkpoint_checksum.py")
    output = tmp_path / "checkpoint_checksum.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(script),
            "--quick",
            "--repeats",
            "1",
            "--dir",
            str(tmp_path),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", ""),
        },
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "time ratio read+xxh3_64/read" in completed.stdout
    result = json.loads(output.read_text())
    assert result["bytes"] >= 4 * 1024 * 1024 * 4  # the four 1024 x 1024 f32 layers at least
    assert set(result["checksums"]) == {"xxh3_64", "crc32", "sha256", "blake2b"}
    assert all(row["time_over_read"] > 0 for row in result["checksums"].values())
    assert [path.name for path in tmp_path.iterdir()] == [
        "checkpoint_checksum.json"
    ]  # cleaned up after itself
