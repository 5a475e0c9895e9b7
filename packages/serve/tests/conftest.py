"""Shared test setup of halyard-serve: tiny models of every family, a single torch thread."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tiny_models.py sits next to the tests

try:
    import torch

    torch.set_num_threads(1)
except ImportError:
    pass
