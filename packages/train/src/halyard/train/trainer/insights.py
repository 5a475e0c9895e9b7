"""What the trainer logs from inside its steps beside the metrics: the watched steps' statistics (per module,
per layer), their histograms, and loss spikes with the data positions of their worst examples."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from halyard.train.run_config import TrainConfig
from halyard.train.watch.host import flatten_arrays, worst_rows
from halyard.train.watch.spikes import SPIKE_LOG, SpikeLog, SpikeTest

Locate = Callable[[int, int], dict[str, Any] | None]
"""``(loader step, row) -> data position`` of a row of a global batch (`example_position`), or None."""

Histograms = dict[str, tuple[np.ndarray, np.ndarray]]
"""name -> (counts ``[bins]``, bin edges ``[bins + 1]``)."""


class StepInsights:
    """Takes the watched statistics, histograms and per-example losses out of a step's fetched metrics, and
    tests the loss for spikes.

    Args:
        config: the run config (``trainer.spikes``, ``trainer.batch_size``, ``trainer.run_dir``).
        run_dir: where ``spikes.jsonl`` goes.
        start_step: the step this process starts from (a resumed run's spike lines after it are dropped).
        main: whether this process prints and writes (process 0).
        locate: the data position of a batch row, for the spikes' worst examples (None: rows only).
    """

    def __init__(
        self, config: TrainConfig, run_dir: Path, *, start_step: int, main: bool, locate: Locate | None = None
    ) -> None:
        self.config = config
        self.main = main
        self.locate = locate
        self.spikes = SpikeTest(config.trainer.spikes)
        self.spike_log = SpikeLog(run_dir / SPIKE_LOG, resume_step=start_step + 1) if main else None

    def take(self, step: int, metrics: dict[str, Any]) -> tuple[dict[str, float], Histograms]:
        """Remove ``watch``, ``histograms`` and ``examples`` from ``metrics`` (fetched, of ``step``).

        Returns:
            The numbers to log at ``step`` besides the metrics (the watched statistics flattened, ``spike/*``
            when the loss is a spike) and the histograms.
        """
        scalars = flatten_arrays(metrics.pop("watch", {}))
        histograms = {
            name: (np.asarray(value["counts"]), np.asarray(value["edges"]))
            for name, value in metrics.pop("histograms", {}).items()
        }
        examples = metrics.pop("examples", None)
        found = self.spikes.check(step, float(np.asarray(metrics["loss"])))
        if found is not None:
            zscore, mean, std = found
            scalars.update({"spike/zscore": zscore, "spike/loss": float(np.asarray(metrics["loss"]))})
            if self.main:
                self._report(step, float(np.asarray(metrics["loss"])), zscore, mean, std, examples)
        return scalars, histograms

    def _report(
        self, step: int, loss: float, zscore: float, mean: float, std: float, examples: dict[str, Any] | None
    ) -> None:
        cfg = self.config.trainer
        worst = []
        for row, row_loss, tokens in worst_rows(examples, cfg.spikes.worst_examples) if examples else []:
            position = self.locate(step - 1, row) if self.locate is not None else None
            worst.append({**(position or {"row": row}), "loss": row_loss, "tokens": tokens})
        replay = f"halyard replay --run {cfg.run_dir} --step {step}"
        first = (step - 1) * cfg.batch_size
        record = {
            "step": step,
            "loss": loss,
            "zscore": zscore,
            "mean": mean,
            "std": std,
            "recent_steps": len(self.spikes.recent),
            "examples": [first, first + cfg.batch_size],
            "worst": worst,
            "replay": replay,
        }
        assert self.spike_log is not None
        self.spike_log.write(record)
        named = "; ".join(_describe(example) for example in worst) or "per-example losses not computed"
        print(
            f"loss spike at step {step}: loss {loss:.4f} is {zscore:.1f} standard deviations above the mean "
            f"{mean:.4f} of the last {len(self.spikes.recent)} steps (batch: examples {first} to "
            f"{first + cfg.batch_size - 1}); worst examples: {named}; replay: {replay}",
            flush=True,
        )


def _describe(example: dict[str, Any]) -> str:
    documents = ", ".join(
        f"document {doc['document']} from token {doc['offset']}" for doc in example.get("documents", [])
    )
    return f"row {example['row']} (loss {example['loss']:.3f}" + (f"; {documents})" if documents else ")")
