"""A tracker writing one JSON line per step: the simplest record a script or a test can read back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from halyard.train.trackers.base import Metrics, json_number, scalar_metrics


class JsonlTracker:
    """Appends `{"step": N, "<name>": value, ...}` per `log` call to a JSONL file, flushed each line.

    A resumed run passes `resume_step`: lines for steps at or after it (written by the interrupted run
    after its last checkpoint) are removed first, so the file holds each step once. The summary goes to a
    separate JSON file next to it (`metrics.summary.json` for `metrics.jsonl`).
    """

    def __init__(self, path: str | os.PathLike[str], resume_step: int | None = None):
        """Open (or create) the metrics file.

        Args:
            path: the JSONL file; its directory is created if missing.
            resume_step: the step a resumed run continues from (None for a fresh run, which appends).
        """
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [line for line in read_jsonl(self.path) if line.get("step", -1) < resume_step]
            temporary = self.path.with_name(f".{self.path.name}.tmp")
            temporary.write_text("".join(json.dumps(line) + "\n" for line in kept))
            os.replace(temporary, self.path)
        self._stream = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)

    @property
    def summary_path(self) -> Path:
        """Where `log_summary` writes."""
        return self.path.with_name(f"{self.path.stem}.summary.json")

    def log(self, metrics: Metrics, step: int) -> None:
        """Append one line for `step` (NaN and infinities are written as strings, keeping the JSON valid)."""
        line = {"step": int(step), **{k: json_number(v) for k, v in scalar_metrics(metrics).items()}}
        self._stream.write(json.dumps(line) + "\n")
        self._stream.flush()

    def log_summary(self, metrics: Metrics) -> None:
        """Merge `metrics` into the summary JSON file (values that are not numbers are stored as text)."""
        summary: dict[str, Any] = (
            json.loads(self.summary_path.read_text()) if self.summary_path.exists() else {}
        )
        for key, value in metrics.items():
            try:
                summary[key] = json_number(scalar_metrics({key: value})[key])
            except ValueError:
                summary[key] = str(value)
        self.summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def finish(self) -> None:
        """Close the file."""
        self._stream.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL metrics file into a list of dicts (one per line; a torn last line is ignored).

    Args:
        path: the file written by `JsonlTracker`.
    """
    lines = []
    for text in Path(path).read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue  # a line cut short by a crash mid-write
    return lines
