"""Compiling every step program an engine can ask for before the first request (`EngineConfig.warmup`).

The shapes form a small fixed set (`ModelRunner.shape_set`): one flat step program for every token bucket
(powers of two from ``min_rows`` up to the most tokens of one step, `EngineConfig.step_budget`) and every
page bucket (powers of two up to the pages of the longest sequence). Each is compiled and run once on
padding (which stores nothing); after that no step compiles, except one that asks for prompt log-probs or
top alternatives: those programs compile on first use, or at start too with `EngineConfig.warmup_logprobs`
(``logprob_variants``). With `EngineConfig.compilation_cache` the
compiled programs are also kept on disk, and a second start loads them.
"""

from __future__ import annotations

import logging
import time

import jax

from halyard.serve.program import ProgramShape
from halyard.serve.runner import ModelRunner

logger = logging.getLogger("halyard.serve.warmup")


def warm_up(runner: ModelRunner, *, logprob_variants: bool = False) -> list[ProgramShape]:
    """Compile and run once every shape of ``runner``'s set, logging one progress line per shape (INFO,
    logger ``halyard.serve.warmup``: ``compiled step shape k of n ...``).

    Args:
        runner: the engine's runner.
        logprob_variants: also the shapes' variants with prompt log-probs and top alternatives.

    Returns:
        The shapes, in the order compiled.
    """
    shapes = runner.shape_set(logprob_variants=logprob_variants)
    started = time.perf_counter()
    for index, shape in enumerate(shapes, start=1):
        began = time.perf_counter()
        jax.block_until_ready(runner.run(shape, runner.example_inputs(shape)))
        logger.info(
            "compiled step shape %d of %d (tokens %d, sequences %d, pages %d) in %.1f s",
            index, len(shapes), shape.tokens, shape.seqs, shape.seq_pages, time.perf_counter() - began,
        )  # fmt: skip
    logger.info(
        "warm-up: %d step shapes, %d programs compiled in %.1f s (%.1f s in all)",
        len(shapes), runner.programs_compiled, runner.compile_seconds, time.perf_counter() - started,
    )  # fmt: skip
    return shapes
