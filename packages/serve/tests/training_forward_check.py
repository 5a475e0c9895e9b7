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
    TARGET,
    TARGET_PROMPT,
    VOCAB,
    config,
    invariant_forward_difference,
    model,
)

from halyard.serve import Engine, SamplingParams  # noqa: E402

if __name__ == "__main__":
    # This process compiles at XLA's full optimisation (about 10 s a program here), so its engines compile few
    # programs: the target's prompt is one prefill chunk (128), and the others' prompts and completions fit its
    # two pages. One prompt is prefilled a step and request i draws its last token at step i + max_tokens - 1:
    # all end with the target (step 30), so the steps after the last prefill decode all 21 together (one
    # program of 32 rows, not one per count as they end). The engine compiles at min_rows 1: its decoding
    # programs of 1 or 2 tokens are where fused multiply-adds differed (1.8e-5).
    differences, alone = {}, {}
    for rows in (32, 64):
        engine = Engine(model(), config(128, decode_rows=rows, training_arithmetic=True, prefill_rows=1))
        (output,) = engine.generate([TARGET_PROMPT], TARGET)
        alone[rows] = output.samples[0]
        differences[rows] = invariant_forward_difference(alone[rows])
    rng = np.random.default_rng(3)
    others = [[int(t) for t in rng.integers(0, VOCAB, int(rng.integers(65, 98)))] for _ in range(20)]
    params = [SamplingParams(max_tokens=31 - i) for i in range(21)]
    params[7] = TARGET
    engine.pages.clear_cache()  # the target's whole prompt is prefilled again, not its first page from the cache
    outputs = engine.generate([*others[:7], TARGET_PROMPT, *others[7:]], params)
    among = outputs[7].samples[0]
    same = among.token_ids == alone[64].token_ids and among.logprobs == alone[64].logprobs
    print(json.dumps({"unfused": UNFUSED, "differences": differences, "among_others_bitwise": same}))
