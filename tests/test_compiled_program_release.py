"""The root conftest drops JAX's compiled programs in a test worker that nears the kernel's limit on memory maps
(each cached CPU program keeps LLVM's code mapped; past vm.max_map_count a worker died of a segfault) or its
resident-memory limit, and the memory goes back to the system."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp

spec = importlib.util.spec_from_file_location(
    "root_conftest", Path(__file__).resolve().parents[1] / "conftest.py"
)
assert spec is not None and spec.loader is not None
root_conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(root_conftest)


def test_compiled_programs_are_dropped_past_the_threshold_and_their_maps_freed() -> None:
    for size in range(2, 82):
        jax.jit(lambda x: jnp.sin(x) + (x @ x.T).sum())(jnp.ones((size, 3))).block_until_ready()
    held = root_conftest.mapped_regions()
    assert held > 0
    assert not root_conftest.release_compiled_programs(held + 10_000)  # under the threshold: kept
    assert root_conftest.release_compiled_programs(1)
    assert root_conftest.mapped_regions() < held
    assert root_conftest.MAP_LIMIT > 0  # read from /proc/sys/vm/max_map_count on Linux


def test_past_the_resident_limit_the_programs_and_their_memory_are_released() -> None:
    for size in range(2, 122):
        jax.jit(lambda x: jnp.cos(x) * (x @ x.T).sum())(jnp.ones((size, 5))).block_until_ready()
    resident = root_conftest.resident_bytes()
    maps = root_conftest.mapped_regions()
    assert not root_conftest.release_compiled_programs(0, resident + 2**30)  # under both limits: kept
    assert root_conftest.release_compiled_programs(0, resident // 2)
    # 120 programs grew the process by 211 MB and 144 MB of it returned (without malloc_trim, almost none)
    assert root_conftest.resident_bytes() < resident - 64 * 2**20
    assert root_conftest.mapped_regions() < maps
