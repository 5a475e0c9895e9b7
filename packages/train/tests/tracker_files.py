"""Reading back what the trackers wrote: TensorBoard event files and offline wandb runs (shared by tests)."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
from tensorboardX.proto import event_pb2

from halyard.train.trackers.wandb_offline import read_offline_run


def _events(log_dir: Path):
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        position = 0
        while position < len(data):
            (length,) = struct.unpack("<Q", data[position : position + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[position + 12 : position + 12 + length])
            position += 12 + length + 4
            yield event


def read_tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Parse TFRecord event files (u64 length, u32 crc, payload, u32 crc) into tag -> [(step, value)]."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for event in _events(log_dir):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def read_tensorboard_histograms(log_dir: Path) -> dict[str, list[tuple[int, np.ndarray, np.ndarray]]]:
    """tag -> [(step, bucket counts, bucket upper limits)] of the histograms in the event files."""
    found: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for event in _events(log_dir):
        for value in event.summary.value:
            if value.HasField("histo"):
                histo = value.histo
                found.setdefault(value.tag, []).append(
                    (event.step, np.array(histo.bucket), np.array(histo.bucket_limit))
                )
    return found


def read_when_flushed(path: Path, patience_seconds: float = 60.0) -> dict:
    """wandb's service may still be writing a run file just after `finish()` returns: wait (bounded) for it."""
    deadline = time.monotonic() + patience_seconds
    while True:
        run = read_offline_run(path)
        if (run["run_id"] is not None and run["history"]) or time.monotonic() > deadline:
            return run
        time.sleep(0.2)
