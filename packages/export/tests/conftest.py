"""Shared test setup: helpers importable from the tests, a single torch thread (the machine is shared)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # hf_cases.py sits next to the tests

import torch

torch.set_num_threads(1)
