"""Compiling every step program an engine can ask for before the first request (`EngineConfig.warmup`).

The shapes form a small fixed set (`ModelRunner.shape_set`): decoding programs (one token a row) and
prefill programs (``chunk_size`` tokens a row), each for every row bucket (powers of two from ``min_rows``
up to the most rows of one program) and every page bucket (powers of two up to the pages of the longest
sequence). Each is run once on padding (which stores nothing), so that its step program and the program
that stores its keys and values are both compiled; after that no step compiles, except one that asks for
prompt log-probs (those programs compile on first use). With `EngineConfig.compilation_cache` the
compiled programs are also kept on disk, and a second start loads them.
"""

from __future__ import annotations

import logging
import time

from halyard.serve.config import EngineConfig
from halyard.serve.program import ProgramShape
from halyard.serve.runner import ModelRunner, example_inputs

logger = logging.getLogger("halyard.serve.warmup")


def warm_up(runner: ModelRunner, config: EngineConfig) -> list[ProgramShape]:
    """Compile and run once every shape of ``runner``'s set, logging one progress line per shape (INFO,
    logger ``halyard.serve.warmup``: ``compiled step shape k of n ...``).

    Args:
        runner: the engine's runner.
        config: the engine's config (its program rows and chunk size).

    Returns:
        The shapes, in the order compiled.
    """
    decode_rows, prefill_rows = config.program_rows()
    shapes = runner.shape_set(decode_rows, 1) + runner.shape_set(prefill_rows, config.chunk_size)
    started = time.perf_counter()
    for index, shape in enumerate(shapes, start=1):
        began = time.perf_counter()
        runner.run(shape, example_inputs(shape, runner.page_size))
        logger.info(
            "compiled step shape %d of %d (rows %d, tokens %d, pages %d) in %.1f s",
            index, len(shapes), shape.rows, shape.tokens, shape.seq_pages, time.perf_counter() - began,
        )  # fmt: skip
    logger.info(
        "warm-up: %d step shapes, %d programs compiled in %.1f s (%.1f s in all)",
        len(shapes), runner.programs_compiled, runner.compile_seconds, time.perf_counter() - started,
    )  # fmt: skip
    return shapes
