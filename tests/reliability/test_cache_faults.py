"""Token-cache builds killed at random moments, read while being built, and built by two processes at once.

The build command runs in its own process group (``python -m halyard.data build``); ``kill -9`` of the
group stands for an OOM kill or a lost machine. A reader polling the cache while it is built must only
ever see tokens that equal the uninterrupted build's; a resumed build must end byte-identical to it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from data_helpers import folder_bytes, make_documents, train_tokenizer, write_jsonl_shards

from halyard.data import TokenCache, build_cache

CHUNK_TOKENS = 100


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """(source folder with bad records all along, tokenizer.json, an uninterrupted build of it)."""
    root = tmp_path_factory.mktemp("cache-corpus")
    write_jsonl_shards(root / "src", make_documents(3000, seed=5), num_shards=3)
    for path in (root / "src").iterdir():
        lines = path.read_text().splitlines(keepends=True)
        for count, position in enumerate(range(len(lines) - 1, 0, -50)):
            lines.insert(position, '{"text": broken\n' if count % 2 else "\n")
        path.write_text("".join(lines))
    tokenizer = root / "tokenizer.json"
    train_tokenizer().save(str(tokenizer))
    reference = root / "reference"
    build_cache(
        str(root / "src"),
        str(tokenizer),
        str(reference),
        num_workers=0,
        chunk_tokens=CHUNK_TOKENS,
        progress=False,
    )
    return root / "src", str(tokenizer), reference


def start_build(source: Path, tokenizer: str, out: Path, log: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "halyard.data", "build", "--source", str(source), "--tokenizer", tokenizer,
        "--out", str(out), "--workers", "2", "--chunk-tokens", str(CHUNK_TOKENS), "--no-progress",
    ]  # fmt: skip
    with open(log, "w") as handle:
        return subprocess.Popen(command, start_new_session=True, stdout=handle, stderr=subprocess.STDOUT)


def check_visible_tokens(cache_dir: Path, expected: np.ndarray) -> int:
    """Open the (maybe half-built) cache as a reader would; every visible token equals the reference's."""
    if not (cache_dir / "ledger.json").exists():
        return 0
    cache = TokenCache.open(str(cache_dir))
    visible = cache.num_tokens
    np.testing.assert_array_equal(cache.read(0, visible), expected[:visible])
    return visible


@pytest.mark.parametrize("trial", range(3))
def test_build_killed_at_a_random_moment_resumes_byte_identical(
    tmp_path: Path, corpus: tuple[Path, str, Path], trial: int
) -> None:
    source, tokenizer, reference = corpus
    expected = TokenCache.open(str(reference)).read(0, TokenCache.open(str(reference)).num_tokens)
    rng = np.random.default_rng(100 + trial)
    out = tmp_path / "killed"
    build = start_build(source, tokenizer, out, tmp_path / "build.log")
    seen = 0
    deadline = time.monotonic() + 300
    while not any(out.glob("shards/*/ledger.json")):  # the first chunk is committed
        assert build.poll() is None, (tmp_path / "build.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the build never committed a chunk"
        seen = max(seen, check_visible_tokens(out, expected))
        time.sleep(0.01)
    kill_at = time.monotonic() + float(rng.uniform(0.0, 0.4))
    while time.monotonic() < kill_at:
        seen = max(seen, check_visible_tokens(out, expected))  # a reader during the build
    os.killpg(build.pid, signal.SIGKILL)
    status = build.wait(timeout=60)
    assert status == -signal.SIGKILL and not TokenCache.open(str(out)).is_finished, "finished before the kill"
    assert check_visible_tokens(out, expected) >= seen  # nothing seen before is gone after the kill
    resumed = build_cache(
        str(source), tokenizer, str(out), num_workers=0, chunk_tokens=CHUNK_TOKENS, progress=False
    )
    assert resumed.is_finished
    assert folder_bytes(out) == folder_bytes(reference)


def test_two_processes_building_the_same_cache_at_once(
    tmp_path: Path, corpus: tuple[Path, str, Path]
) -> None:
    source, tokenizer, reference = corpus
    out = tmp_path / "shared"
    builds = [start_build(source, tokenizer, out, tmp_path / f"build{i}.log") for i in range(2)]
    try:
        statuses = [build.wait(timeout=600) for build in builds]
    finally:
        for build in builds:
            if build.poll() is None:
                os.killpg(build.pid, signal.SIGKILL)
    logs = [(tmp_path / f"build{i}.log").read_text() for i in range(2)]
    assert statuses == [0, 0], logs
    assert TokenCache.open(str(out)).is_finished
    assert folder_bytes(out) == folder_bytes(reference)
