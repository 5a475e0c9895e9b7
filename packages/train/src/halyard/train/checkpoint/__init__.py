"""Checkpoints: asynchronous, atomic saves on orbax (OCDBT over TensorStore), keep policies, restore onto
any mesh, and preemption handling. Nothing is imported here: import each piece from its module.

```python
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.policies import KeepPolicy, SavePolicy

manager = CheckpointManager(run_dir / "checkpoints", save_policy=SavePolicy(every_steps=1000,
                            every_seconds=1800), keep_policy=KeepPolicy(keep_last=2, keep_every_steps=10_000))
restored = manager.restore(None, jax.eval_shape(init_state), expected_data=data_position)
...
manager.maybe_save(step, state, {"data": data_position, "config_hash": config_hash})
```
"""
