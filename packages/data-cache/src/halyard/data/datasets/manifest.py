"""The identity of a data stream, stored with checkpoints to refuse resuming on other data."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DataManifest:
    """What decides every batch: cache fingerprints, seed and dataset settings (hashable, comparable).

    Attributes:
        kind: the dataset class (``"lm"`` or ``"mixture"``).
        settings: the settings as a canonical JSON string (sorted keys), including nested manifests.
    """

    kind: str
    settings: str

    @classmethod
    def create(cls, kind: str, settings: dict[str, Any]) -> DataManifest:
        """Build a manifest from plain JSON-able settings."""
        return cls(kind, json.dumps(settings, sort_keys=True, separators=(",", ":")))

    @property
    def digest(self) -> str:
        """A short hash of the manifest, for logs and checkpoint metadata."""
        return hashlib.sha256(f"{self.kind}:{self.settings}".encode()).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain data (what a checkpoint stores)."""
        return {"kind": self.kind, "settings": json.loads(self.settings), "digest": self.digest}

    def differences(self, other: DataManifest) -> list[str]:
        """Readable ``key: mine -> other`` lines (empty when equal)."""
        if self == other:
            return []
        mine, theirs = json.loads(self.settings), json.loads(other.settings)
        lines = [f"kind: {self.kind} -> {other.kind}"] if self.kind != other.kind else []
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                lines.append(f"{key}: {mine.get(key)!r} -> {theirs.get(key)!r}")
        return lines
