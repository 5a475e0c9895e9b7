"""A build killed with SIGKILL at a random moment resumes to the same bytes as an uninterrupted build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from data_helpers import folder_bytes, make_documents, write_jsonl_shards

from halyard.data import TokenCache, build_cache

SETTINGS = {"chunk_tokens": 100, "progress": False}


def test_kill_minus_nine_then_resume_is_byte_identical(tmp_path: Path, tokenizer_path: str):
    write_jsonl_shards(tmp_path / "src", make_documents(4000, seed=31), num_shards=3)
    for path in (tmp_path / "src").iterdir():  # bad records all along, so resumed counters are checked too
        lines = path.read_text().splitlines(keepends=True)
        for count, position in enumerate(range(len(lines) - 1, 0, -40)):
            lines.insert(position, '{"text": broken\n' if count % 2 else "\n")
        path.write_text("".join(lines))
    build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "reference"), num_workers=0, **SETTINGS)

    killed = tmp_path / "killed"
    command = [
        sys.executable, "-m", "halyard.data", "build", "--source", str(tmp_path / "src"),
        "--tokenizer", tokenizer_path, "--out", str(killed), "--workers", "2", "--chunk-tokens", "100",
        "--no-progress",
    ]  # fmt: skip
    # A new session, so the kill reaches the worker processes too (as an OOM kill of the whole job would).
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )

    def cut_midway() -> bool:
        for path in (killed / "shards").glob("*/ledger.json"):
            try:
                ledger = json.loads(path.read_text())
            except (OSError, ValueError):  # being replaced right now
                continue
            if ledger["chunks"] and not ledger["finished"]:
                return True
        return False

    # Kill while a shard is part-way (not at a fixed delay: on a quiet machine the build may be done by then).
    # No time limit: a build that ends without the chunk seen fails here, one that hangs meets pytest-timeout.
    while not cut_midway():
        assert process.poll() is None, process.stderr.read().decode()  # type: ignore[union-attr]
        time.sleep(0.005)
    time.sleep(np.random.default_rng(1234).uniform(0.0, 0.02))
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert not json.loads((killed / "ledger.json").read_text())["finished"], "the build ended before the kill"

    shard_ledgers = [json.loads(path.read_text()) for path in sorted(killed.glob("shards/*/ledger.json"))]
    assert any(ledger["chunks"] and not ledger["finished"] for ledger in shard_ledgers), (
        "no shard was cut midway"
    )
    partial = TokenCache.open(str(killed))
    assert not partial.is_finished
    reference = TokenCache.open(str(tmp_path / "reference"))
    np.testing.assert_array_equal(partial.read(0, partial.num_tokens), reference.read(0, partial.num_tokens))

    resumed = build_cache(str(tmp_path / "src"), tokenizer_path, str(killed), num_workers=0, **SETTINGS)
    assert resumed.is_finished
    assert (
        resumed.totals["counters"]["malformed_json"] > 5 and resumed.totals["counters"]["empty_document"] > 5
    )
    assert folder_bytes(killed) == folder_bytes(tmp_path / "reference")
