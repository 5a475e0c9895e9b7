"""Shared test setup of halyard-serve: tiny models of every family, a single torch thread, and the server
that test_server_answers.py and test_server_operation.py share (`server_fixtures`: one start for both)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tiny_models.py sits next to the tests

try:
    import torch

    torch.set_num_threads(1)
except ImportError:
    pass

from server_fixtures import client, folder, model, server, tokenizer  # noqa: F401  (session fixtures)
