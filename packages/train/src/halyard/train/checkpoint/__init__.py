"""Checkpoints: asynchronous, atomic saves on orbax (OCDBT over TensorStore), keep policies, restore onto
any mesh, and preemption handling.

```python
from halyard.train.checkpoint import CheckpointManager, SavePolicy, KeepPolicy

manager = CheckpointManager(run_dir / "checkpoints", save_policy=SavePolicy(every_steps=1000,
                            every_seconds=1800), keep_policy=KeepPolicy(keep_last=2, keep_every_steps=10_000))
restored = manager.restore(None, jax.eval_shape(init_state), expected_data=data_position)
...
manager.maybe_save(step, state, {"data": data_position, "config_hash": config_hash})
```
"""

from halyard.train.checkpoint.commit_marker import (
    ChecksumMismatchError,
    CommitMarker,
    DamagedCheckpointError,
    UnverifiedCheckpointWarning,
    read_commit_marker,
)
from halyard.train.checkpoint.data_position import DATA_METADATA_KEY, DataMismatchError, metadata_differences
from halyard.train.checkpoint.discovery import (
    CheckpointNotFoundError,
    CheckpointScan,
    DamagedCheckpointWarning,
    latest_complete,
    resolve_checkpoint,
    scan_checkpoints,
)
from halyard.train.checkpoint.layout import step_directory
from halyard.train.checkpoint.leaves import LeafRecord
from halyard.train.checkpoint.manager import CheckpointManager, CheckpointWriteError
from halyard.train.checkpoint.policies import KeepPolicy, SavePolicy
from halyard.train.checkpoint.preemption import (
    PREEMPTION_EXIT_CODE,
    PreemptionFlag,
    install_preemption_handler,
)
from halyard.train.checkpoint.process_agreement import broadcast_from_process_zero, true_on_any_process
from halyard.train.checkpoint.restore import RestoredCheckpoint, restore, restore_weights

__all__ = [
    "DATA_METADATA_KEY",
    "PREEMPTION_EXIT_CODE",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CheckpointScan",
    "CheckpointWriteError",
    "ChecksumMismatchError",
    "CommitMarker",
    "DamagedCheckpointError",
    "DamagedCheckpointWarning",
    "DataMismatchError",
    "KeepPolicy",
    "LeafRecord",
    "PreemptionFlag",
    "RestoredCheckpoint",
    "SavePolicy",
    "UnverifiedCheckpointWarning",
    "broadcast_from_process_zero",
    "install_preemption_handler",
    "latest_complete",
    "metadata_differences",
    "read_commit_marker",
    "resolve_checkpoint",
    "restore",
    "restore_weights",
    "scan_checkpoints",
    "step_directory",
    "true_on_any_process",
]
