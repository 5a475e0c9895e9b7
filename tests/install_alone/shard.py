"""Smoke use of halyard-shard installed alone: a mesh over 8 simulated CPU devices and a layout on it."""

import jax

from halyard.named import Axis
from halyard.shard import Layout, MeshSpec

assert jax.device_count() == 8, f"expected 8 simulated devices (XLA_FLAGS), got {jax.device_count()}"
mesh = MeshSpec(data=2, fsdp=2, tensor=2).build()
sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
assert (sizes["data"], sizes["fsdp"], sizes["tensor"]) == (2, 2, 2), sizes
spec = Layout.fsdp().partition_spec([Axis("embed", 512), Axis("mlp", 2048)], mesh)
assert "fsdp" in str(spec), spec
print("shard ok", sizes, spec)
