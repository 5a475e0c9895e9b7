"""Shared test settings: modest, deterministic hypothesis budgets so the suite stays fast on 2 cores."""

import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile(
    "halyard",
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI failures reproduce, nothing flickers
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("halyard")

# Test helper modules (named_strategies.py) sit next to the tests; pytest's importlib mode does not add
# this folder to sys.path by itself.
sys.path.insert(0, str(Path(__file__).parent))
