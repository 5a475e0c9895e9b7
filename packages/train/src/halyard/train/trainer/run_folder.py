"""The run folder as `Trainer.fit` makes it: created with a one-line error when it cannot be, and left as it
was when the run stops on bad input before its first step (no half-made run folder)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import TracebackType

from halyard.train.config.errors import ConfigError
from halyard.train.user_errors import INPUT_ERROR_EXIT_CODE, exit_code_of


class RunFolder:
    """``with RunFolder(path, writes=...) as folder:`` creates ``path``; until `keep` is called, an error
    of bad input (exit code 2) leaving the block removes what the block added to it.

    Args:
        path: ``trainer.run_dir``.
        writes: whether this process creates and cleans the folder (process 0 of a run of several).
    """

    def __init__(self, path: Path, *, writes: bool = True) -> None:
        self.path = path
        self.writes = writes
        self._existed_before: set[str] | None = None
        self._kept = False

    def __enter__(self) -> RunFolder:
        if not self.writes:
            return self
        self._existed_before = set(os.listdir(self.path)) if self.path.is_dir() else None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except (PermissionError, NotADirectoryError, FileExistsError) as error:
            raise ConfigError(
                f"trainer.run_dir={self.path}: cannot create the run folder ({error.strerror}: "
                f"{error.filename}); choose a folder you can write to"
            ) from error
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise ConfigError(
                f"trainer.run_dir={self.path}: the run folder is not writable; choose a folder you can write to"
            )
        return self

    def keep(self) -> None:
        """From now on the folder is kept whatever happens (the run has trained)."""
        self._kept = True

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is None or self._kept or not self.writes or exit_code_of(error) != INPUT_ERROR_EXIT_CODE:
            return
        added = set(os.listdir(self.path)) - (self._existed_before or set())
        for name in added:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        if self._existed_before is None:
            with_contents = any(self.path.iterdir())
            if not with_contents:
                self.path.rmdir()
