"""Run as a script, in a process of its own (test_deterministic.py): a deterministic engine's log-probs
against the training forward pass inside `batch_invariant`, in a process without fused multiply-adds.

Prints one JSON object: whether XLA runs without fused multiply-adds, and the largest |engine - training
forward| log-prob by the decoding program's rows.
"""

from __future__ import annotations

import json

from halyard.named.nn import unfuse_multiply_add

UNFUSED = unfuse_multiply_add()  # before JAX starts its backend (the imports below do not start it)

from deterministic_case import MODEL, TARGET, TARGET_PROMPT, config, invariant_forward_difference  # noqa: E402

from halyard.serve import Engine  # noqa: E402

if __name__ == "__main__":
    differences = {}
    for rows in (32, 64):
        (output,) = Engine(MODEL, config(64, decode_rows=rows)).generate([TARGET_PROMPT], TARGET)
        differences[rows] = invariant_forward_difference(output.samples[0])
    print(json.dumps({"unfused": UNFUSED, "differences": differences}))
