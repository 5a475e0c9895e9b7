"""Periodic validation: loss, perplexity and bits per byte on held-out windows."""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import numpy as np

from halyard.data import LMDataset
from halyard.shard import Layout, global_batch_from_local, process_count, process_index
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.data import load_run_tokenizer
from halyard.train.trainer.loss import lm_loss_fn


def target_bytes(tokenizer: Any, batches: list[dict[str, np.ndarray]]) -> float:
    """UTF-8 bytes of the labels the loss counts: those in their input's document and in the loss mask.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (its ``decode`` turns ids into text).
        batches: loader batches: ``tokens [rows, seq_len + 1]`` and optionally ``segment_ids`` and
            ``loss_mask`` of the same shape.

    Each run of consecutive counted labels is decoded at once (a character split over several byte-level
    tokens only decodes whole).
    """
    total = 0
    for batch in batches:
        tokens = np.asarray(batch["tokens"])
        counted = np.ones(tokens[:, 1:].shape, bool)
        if batch.get("segment_ids") is not None:
            segments = np.asarray(batch["segment_ids"])
            counted &= segments[:, 1:] == segments[:, :-1]
        if batch.get("loss_mask") is not None:
            counted &= np.asarray(batch["loss_mask"])[:, 1:] > 0
        for row, keep in zip(tokens[:, 1:], counted, strict=True):
            for run in _runs(row, keep):
                total += len(tokenizer.decode(run, skip_special_tokens=False).encode("utf-8"))
    return float(total)


def _runs(row: np.ndarray, keep: np.ndarray) -> list[list[int]]:
    """The maximal runs of consecutive entries of ``row`` where ``keep`` is true."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], keep.astype(np.int8), [0]])))
    return [row[start:stop].tolist() for start, stop in zip(edges[::2], edges[1::2], strict=True)]


class Evaluator:
    """Evaluates a model on the first ``trainer.eval_batches`` validation batches (the same ones each time).

    Bits per byte divide the summed loss (in bits) by the UTF-8 bytes of the evaluated target tokens,
    decoded with the run's tokenizer (a tokenizer.json or a folder), so runs with different tokenizers
    compare.
    """

    def __init__(
        self, dataset: LMDataset, config: TrainConfig, mesh: Any, layout: Layout, tokenizer_path: str
    ):
        self.dataset = dataset
        self.config = config
        self.mesh = mesh
        self.layout = layout
        self.tokenizer = load_run_tokenizer(tokenizer_path)
        loss_fn = lm_loss_fn()
        self._loss = jax.jit(lambda model, batch: loss_fn(model, batch, jax.random.PRNGKey(0)))
        self._bytes: float | None = None

    def _batches(self) -> list[dict[str, np.ndarray]]:
        size = self.config.trainer.batch_size
        return [
            self.dataset.batch(i, size, host_index=process_index(), host_count=process_count())
            for i in range(self.config.trainer.eval_batches)
        ]

    def evaluate(self, model: Any) -> tuple[dict[str, float], float]:
        """``({eval_loss, eval_perplexity, eval_bits_per_byte}, seconds taken)``."""
        started = time.monotonic()
        batches = self._batches()
        if self._bytes is None:
            # Bytes of the whole global batch: the loss below is summed over every host's rows.
            size = self.config.trainer.batch_size
            self._bytes = target_bytes(
                self.tokenizer, [self.dataset.batch(i, size) for i in range(len(batches))]
            )
        loss_sum = 0.0
        tokens = 0.0
        for local in batches:
            batch = global_batch_from_local(local, self.mesh, layout=self.layout)
            loss, stats = self._loss(model, batch)
            loss_sum += float(loss)
            tokens += float(stats["num_tokens"])
        mean = loss_sum / max(tokens, 1.0)
        metrics = {
            "eval_loss": mean,
            "eval_perplexity": math.exp(min(mean, 50.0)),
            "eval_bits_per_byte": loss_sum / math.log(2) / max(self._bytes, 1.0),
        }
        return metrics, time.monotonic() - started
