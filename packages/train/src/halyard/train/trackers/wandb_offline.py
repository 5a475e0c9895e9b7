"""Reading the records of an offline wandb run file (`run-<id>.wandb`), so tests can check what was logged.

The file is wandb's LevelDB-style log: a 7-byte header (`:W&B`, magic, version), then 32 KiB blocks of
chunks, each with a 7-byte header (crc32, little-endian length, type: 1 full, 2 first, 3 middle, 4 last)
whose payloads join into serialised `wandb_internal_pb2.Record` messages.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32 * 1024
HEADER_SIZE = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _record_payloads(data: bytes) -> Iterator[bytes]:
    position, pending = HEADER_SIZE, b""
    while position + HEADER_SIZE <= len(data):
        left_in_block = BLOCK_SIZE - position % BLOCK_SIZE
        if left_in_block < HEADER_SIZE:  # block trailer padding
            position += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + HEADER_SIZE])
        if length == 0 and kind == 0:
            break
        chunk = data[position + HEADER_SIZE : position + HEADER_SIZE + length]
        position += HEADER_SIZE + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            yield pending


def read_offline_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an offline wandb run file: its run id, logged history rows and final summary.

    Args:
        path: a `run-<id>.wandb` file under `<run_dir>/wandb/offline-run-*/`.

    Returns:
        `{"run_id": str, "history": [ {name: value, "_step": N, ...}, ... ], "summary": {name: value}}`.

    Raises:
        ValueError: the file is not a wandb run file.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if not data.startswith(b":W&B"):
        raise ValueError(f"{path} is not a wandb run file (no ':W&B' header).")
    result: dict[str, Any] = {"run_id": None, "history": [], "summary": {}}
    for payload in _record_payloads(data):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            result["run_id"] = record.run.run_id
        elif kind == "history":
            result["history"].append(
                {_key(item): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "summary":
            for item in record.summary.update:
                result["summary"][_key(item)] = json.loads(item.value_json)
    return result


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def offline_run_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """All offline wandb run files under a training run directory, oldest first.

    Args:
        run_dir: the training run's directory (the `dir` given to wandb).
    """
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
