"""Compiling every step program an engine can ask for before the first request (`EngineConfig.warmup`).

The shapes form a small fixed set (`ModelRunner.shape_set`): one flat step program for every token bucket
(`halyard.serve.program.token_ladder` from ``min_rows``, or ``token_buckets``, up to the most tokens of one step,
`EngineConfig.step_budget`) and every
page bucket (powers of two up to the pages of the longest sequence). They are compiled several at once
(`EngineConfig.compile_threads`; XLA compiles outside Python's lock, so a TPU host's cores compile side by
side), then each is run once on padding (which stores nothing); after that no step compiles, except one that asks for prompt log-probs or
top alternatives: those programs compile on first use, or at start too with `EngineConfig.warmup_logprobs`
(``logprob_variants``). With `EngineConfig.compilation_cache` the
compiled programs are also kept on disk, and a second start loads them.
"""

from __future__ import annotations

import logging
import os
import time

import jax

from halyard.serve.program import ProgramShape
from halyard.serve.runner import ModelRunner

logger = logging.getLogger("halyard.serve.warmup")


def warm_up(
    runner: ModelRunner, *, logprob_variants: bool = False, threads: int | None = None
) -> list[ProgramShape]:
    """Compile every shape of ``runner``'s set, ``threads`` at a time, logging one progress line per shape
    (INFO, logger ``halyard.serve.warmup``: ``compiled step shape k of n ...``), then run each once.

    Args:
        runner: the engine's runner.
        logprob_variants: also the shapes' variants with prompt log-probs and top alternatives.
        threads: programs compiled at once; None: the machine's cores (``os.cpu_count()``).

    Returns:
        The shapes the engine's steps use, in bucket order. In deterministic mode the row checks choose
        them from the compiled buckets (`ModelRunner.shape_for`), running programs but compiling none.
    """
    buckets = runner.bucket_shapes(logprob_variants=logprob_variants)
    threads = max(1, min(len(buckets), threads or os.cpu_count() or 1))
    started = time.perf_counter()
    logger.info("warm-up: compiling %d step shapes, %d at a time", len(buckets), threads)
    for index, (shape, seconds) in enumerate(runner.compile_shapes(buckets, threads), start=1):
        logger.info(
            "compiled step shape %d of %d (tokens %d, sequences %d, pages %d) in %.1f s",
            index, len(buckets), shape.tokens, shape.seqs, shape.seq_pages, seconds,
        )  # fmt: skip
    shapes = runner.shape_set(logprob_variants=logprob_variants)
    for shape in shapes:
        jax.block_until_ready(runner.run(shape, runner.example_inputs(shape)))
    logger.info(
        "warm-up: %d step shapes, %d programs compiled and %d read from the compilation cache (%d traced) in %.1f s"
        " (%.1f s in all)",
        len(shapes), runner.programs_compiled, runner.programs_loaded, runner.programs_traced, runner.compile_seconds,
        time.perf_counter() - started,
    )  # fmt: skip
    return shapes
