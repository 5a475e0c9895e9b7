"""Starting a run imports what it uses: torch (~2 s, pulled in by tensorboardX) only for TensorBoard."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_and_the_trainer_do_not_import_torch() -> None:
    code = (
        "import sys; import halyard.train.cli, halyard.train.trainer.trainer, halyard.train.trackers; "
        "print(sorted(name for name in ('torch', 'tensorboardX', 'transformers') if name in sys.modules))"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "[]"
