"""Run as a script, in a process of its own (test_deterministic.py): a deterministic engine with the training
arithmetic against the training forward pass inside `batch_invariant`, in a process without fused
multiply-adds.

Prints one JSON object: whether XLA runs without fused multiply-adds, the largest |engine - training
forward| log-prob by the decoding program's rows, and whether the request among 20 others got the same bits
as alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# tiny_models reads the derived tolerances from the root tests/support (the root conftest adds it for pytest).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "support"))

from halyard.named.nn import unfuse_multiply_add

UNFUSED = unfuse_multiply_add()  # before JAX starts its backend (the imports below do not start it)

import numpy as np  # noqa: E402
from deterministic_case import (  # noqa: E402
    MODEL,
    TARGET,
    TARGET_PROMPT,
    VOCAB,
    config,
    invariant_forward_difference,
)

from halyard.serve import Engine, SamplingParams  # noqa: E402

if __name__ == "__main__":
    differences, alone = {}, {}
    for rows in (32, 64):
        engine = Engine(MODEL, config(64, decode_rows=rows, training_arithmetic=True))
        (output,) = engine.generate([TARGET_PROMPT], TARGET)
        alone[rows] = output.samples[0]
        differences[rows] = invariant_forward_difference(alone[rows])
    rng = np.random.default_rng(3)
    others = [[int(t) for t in rng.integers(0, VOCAB, int(rng.integers(1, 150)))] for _ in range(20)]
    outputs = engine.generate([*others[:7], TARGET_PROMPT, *others[7:]], [SamplingParams(max_tokens=9)] * 7 + [TARGET] + [SamplingParams(max_tokens=30)] * 13)  # fmt: skip
    among = outputs[7].samples[0]
    same = among.token_ids == alone[64].token_ids and among.logprobs == alone[64].logprobs
    print(json.dumps({"unfused": UNFUSED, "differences": differences, "among_others_bitwise": same}))
