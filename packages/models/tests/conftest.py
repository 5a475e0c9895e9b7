"""Shared test setup: float32 everywhere, a single torch thread (the machine is shared)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # hf_weights.py and tiny.py sit next to the tests

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the parity tests import torch themselves and fail loudly there
    pass
