"""Checkpoint checksum speed: hashing a checkpoint's files vs reading the same bytes.

Writes one checkpoint with `CheckpointManager` (random f32 weights, incompressible like trained ones),
then times, over every file of the step directory:

1. the bare read (``readinto`` a reusable buffer, the same reads the checksum does);
2. the read plus each candidate checksum: xxh3-64 (what checkpoints record), zlib's crc32, sha256,
   blake2b.

Each ratio is (read + checksum time) / (read time): 1.0 would mean the checksum is free. The files are in
the page cache after the save, so the read is as fast as it gets and the ratios are the worst case; a
read from disk or a network file system is slower, and the checksum's share smaller.

Usage::

    python benchmarks/checkpoints/checkpoint_checksum.py            # ~256 MiB of arrays
    python benchmarks/checkpoints/checkpoint_checksum.py --quick    # ~16 MiB, seconds

Results are printed and written as JSON (``--output``, default benchmarks/results/checkpoint_checksum.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import xxhash

from halyard.train.checkpoint.commit_marker import read_commit_marker
from halyard.train.checkpoint.manager import CheckpointManager

READ_BYTES = 8 * 2**20
Update = Callable[[memoryview], None]


def crc32_update() -> Update:
    value = 0

    def update(chunk: memoryview) -> None:
        nonlocal value
        value = zlib.crc32(chunk, value)

    return update


CANDIDATES: dict[str, Callable[[], Update]] = {
    "xxh3_64": lambda: xxhash.xxh3_64().update,
    "crc32": crc32_update,
    "sha256": lambda: hashlib.sha256().update,
    "blake2b": lambda: hashlib.blake2b().update,
}


def read_all(paths: list[Path], update: Update | None) -> float:
    """Seconds to read every file in ``READ_BYTES`` pieces, feeding each piece to ``update`` if given."""
    buffer = bytearray(READ_BYTES)
    view = memoryview(buffer)
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while count := handle.readinto(buffer):
                if update is not None:
                    update(view[:count])
    return time.perf_counter() - start


def best_of(repeats: int, measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~16 MiB instead of ~256 MiB")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the checkpoint (a temp dir)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/checkpoint_checksum.json"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    num_layers, width = (4, 1024) if args.quick else (16, 2048)
    rng = np.random.default_rng(0)
    state = {f"layer_{i}": rng.standard_normal((width, width), dtype=np.float32) for i in range(num_layers)}
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="checkpoint_checksum-"))
    try:
        with CheckpointManager(work) as manager:
            manager.save(1, jax.tree.map(jax.numpy.asarray, state), wait=True)
        step_dir = work / "step_00000001"
        paths = [step_dir / name for name in read_commit_marker(step_dir).files]
        total_bytes = sum(path.stat().st_size for path in paths)
        read_all(paths, None)  # warm the page cache
        read_seconds = best_of(args.repeats, lambda: read_all(paths, None))
        result: dict = {
            "quick": args.quick,
            "files": len(paths),
            "bytes": total_bytes,
            "read_gb_per_second": total_bytes / read_seconds / 1e9,
            "checksums": {},
        }
        print(
            f"{len(paths)} files, {total_bytes / 2**20:.0f} MiB; bare read {total_bytes / read_seconds / 1e9:.2f} GB/s"
        )
        for name, make_update in CANDIDATES.items():
            seconds = best_of(args.repeats, lambda make_update=make_update: read_all(paths, make_update()))
            ratio = seconds / read_seconds
            result["checksums"][name] = {
                "gb_per_second": total_bytes / seconds / 1e9,
                "time_over_read": ratio,
            }
            print(
                f"{name:8s} {total_bytes / seconds / 1e9:6.2f} GB/s   time ratio read+{name}/read {ratio:5.2f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
