"""halyard.shard: device meshes, layouts from logical axis names to mesh axes, and the multi-process runtime.

```python
from halyard.shard import Layout, MeshSpec, init_sharded

mesh = MeshSpec(fsdp=-1, data=1).build()          # every device on the fsdp axis
layout = Layout.fsdp(min_shard=1024)
params = init_sharded(model_init, layout, mesh, key)  # each device holds only its slice
print(layout.describe(params, mesh))
```
"""

from halyard.shard.cluster import ENV_CLUSTER, ClusterNotFoundError, detect_cluster
from halyard.shard.constrain import ActiveLayout, active_layout, constrain, use_layout, without_layout
from halyard.shard.cpu_threads import reserve_collective_threads, simulated_cpu_devices
from halyard.shard.describe import format_spec
from halyard.shard.global_batch import batch_share, default_batch_axes, global_batch_from_local
from halyard.shard.layout import PRESETS, Layout
from halyard.shard.mesh import BATCH_AXES, DCN_AXES, MESH_AXES, MeshSpec, mesh_axis_sizes
from halyard.shard.padding import check_divisible, pad_for
from halyard.shard.placement import LeafPlacement
from halyard.shard.rules import DimPlacement, normalize_rules
from halyard.shard.runtime import (
    ENV_COORDINATOR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ProcessInfo,
    barrier,
    initialize,
    is_main_process,
    process_count,
    process_index,
    process_info,
)
from halyard.shard.sharded_init import init_sharded

# Before any device is touched: simulated CPU devices get a thread pool their collectives cannot exhaust
# (halyard.shard.cpu_threads).
reserve_collective_threads()

__all__ = [
    "BATCH_AXES",
    "DCN_AXES",
    "ENV_CLUSTER",
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "MESH_AXES",
    "PRESETS",
    "ActiveLayout",
    "ClusterNotFoundError",
    "DimPlacement",
    "Layout",
    "LeafPlacement",
    "MeshSpec",
    "ProcessInfo",
    "active_layout",
    "barrier",
    "batch_share",
    "check_divisible",
    "constrain",
    "default_batch_axes",
    "detect_cluster",
    "format_spec",
    "global_batch_from_local",
    "init_sharded",
    "initialize",
    "is_main_process",
    "mesh_axis_sizes",
    "normalize_rules",
    "pad_for",
    "process_count",
    "process_index",
    "process_info",
    "reserve_collective_threads",
    "simulated_cpu_devices",
    "use_layout",
    "without_layout",
]
