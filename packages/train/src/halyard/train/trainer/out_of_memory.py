"""An accelerator out of memory (when the step compiles or first runs) ends in advice naming the knobs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from halyard.train.run_config import TrainConfig
from halyard.train.user_errors import RunFailure

# How XLA reports memory exhaustion: the status code, and the allocator's own words.
_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


class OutOfMemoryError(RunFailure):
    """The state or the train step does not fit in device memory; the message names the config knobs."""


def is_out_of_memory(error: BaseException) -> bool:
    """True for XLA's memory exhaustion (``RESOURCE_EXHAUSTED`` while compiling, allocating or running)."""
    return any(marker in str(error) for marker in _MARKERS)


def advice(config: TrainConfig, where: str, error: BaseException) -> str:
    """One line: what ran out, XLA's own first line, and the knobs that lower the memory per device."""
    cfg = config.trainer
    xla_says = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    model_remat = getattr(config.model, "remat", None)
    return (
        f"out of device memory while {where} ({xla_says[:300]}). Lower the memory per device: a smaller "
        f"trainer.batch_size={cfg.batch_size} or a larger trainer.accumulation={cfg.accumulation} (fewer "
        f"sequences per microbatch), model.remat={model_remat!r} -> full (recompute activations), "
        f"trainer.layout={cfg.layout} -> fsdp or fsdp_tensor (shard weights and optimizer state over "
        "trainer.mesh), or a shorter data.seq_len; `halyard plan` shows the memory per device before launch"
    )


@contextlib.contextmanager
def out_of_memory_advice(config: TrainConfig, where: str) -> Iterator[None]:
    """Turn XLA's memory exhaustion inside the block into an `OutOfMemoryError` with `advice`.

    Args:
        config: the run config (its knobs are named).
        where: what the block does, e.g. "compiling and running the first train step".
    """
    try:
        yield
    except Exception as error:
        if not is_out_of_memory(error) or isinstance(error, RunFailure):
            raise
        raise OutOfMemoryError(advice(config, where, error)) from error
