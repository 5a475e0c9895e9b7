"""Eight simulated CPU devices for every test of halyard.shard."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import jax
import pytest

DEVICES = 8

# Shared helpers (shard_tree.py) sit next to the tests; pytest's importlib mode does not add this folder.
sys.path.insert(0, str(Path(__file__).parent))

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Only possible before anything used a device; otherwise the check in `devices8` explains the fix.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", DEVICES)


@pytest.fixture(scope="session")
def devices8() -> list:
    """The eight devices the sharding tests place on."""
    devices = jax.devices()
    if len(devices) < DEVICES:
        pytest.fail(
            f"halyard.shard tests need {DEVICES} devices, found {len(devices)}: run them with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES}"
        )
    return devices[:DEVICES]


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so the tests run with --strict-markers from this folder alone.
    config.addinivalue_line(
        "markers", "multiprocess: starts several python processes that talk over localhost"
    )
