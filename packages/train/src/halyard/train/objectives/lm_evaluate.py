"""Periodic validation: loss, perplexity and bits per byte on held-out windows."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from halyard.data import LMDataset
from halyard.shard import Layout, batch_share, global_batch_from_local
from halyard.train.data_assembly.tokenizer import load_run_tokenizer
from halyard.train.invariant.slices import CanonicalSlices, sliced_sums
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.run_config import TrainConfig


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
    compare. A mixture's validation splits (a mapping by source name) are evaluated each on its own
    batches: ``eval/<source>/loss`` (and ``perplexity``, ``bits_per_byte``), with ``eval_loss`` and the
    others over all of them together.
    """

    def __init__(
        self,
        dataset: LMDataset | Mapping[str, LMDataset],
        config: TrainConfig,
        mesh: Any,
        layout: Layout,
        tokenizer_path: str,
    ):
        self.datasets = dict(dataset) if isinstance(dataset, Mapping) else {"": dataset}
        self.by_source = isinstance(dataset, Mapping)
        self.config = config
        self.mesh = mesh
        self.layout = layout
        self.tokenizer = load_run_tokenizer(tokenizer_path)
        self._loss = jax.jit(_batch_loss(config, mesh, layout))
        self._bytes: dict[str, float] = {}

    def _batches(self, dataset: LMDataset) -> list[dict[str, np.ndarray]]:
        size = self.config.trainer.batch_size
        host_index, host_count = batch_share(self.mesh, self.layout)
        return [
            dataset.batch(i, size, host_index=host_index, host_count=host_count)
            for i in range(self.config.trainer.eval_batches)
        ]

    def _sums(self, name: str, dataset: LMDataset, model: Any) -> tuple[float, float, float]:
        """``(summed loss, target tokens, target bytes)`` of one split's evaluation batches."""
        batches = self._batches(dataset)
        if name not in self._bytes:
            # Bytes of the whole global batch: the loss below is summed over every host's rows.
            size = self.config.trainer.batch_size
            self._bytes[name] = target_bytes(
                self.tokenizer, [dataset.batch(i, size) for i in range(len(batches))]
            )
        loss_sum = 0.0
        tokens = 0.0
        for local in batches:
            batch = global_batch_from_local(local, self.mesh, layout=self.layout)
            loss, stats = self._loss(model, batch)
            loss_sum += float(loss)
            tokens += float(stats["num_tokens"])
        return loss_sum, tokens, self._bytes[name]

    def evaluate(self, model: Any) -> tuple[dict[str, float], float]:
        """``({eval_loss, eval_perplexity, eval_bits_per_byte}, seconds taken)``; by source too for a mixture."""
        started = time.monotonic()
        metrics: dict[str, float] = {}
        totals = np.zeros(3)
        for name, dataset in self.datasets.items():
            sums = self._sums(name, dataset, model)
            totals += sums
            if self.by_source:
                own = _figures(*sums)
                metrics.update({f"eval/{name}/{key}": value for key, value in own.items()})
        together = _figures(*(float(total) for total in totals))
        return {f"eval_{key}": value for key, value in together.items()} | metrics, time.monotonic() - started


def _batch_loss(config: TrainConfig, mesh: Any, layout: Layout) -> Any:
    """``(model, batch) -> (loss sum, stats)`` of an evaluation batch; with ``trainer.invariant`` summed over
    the batch's canonical slices in the invariant step's order, so the same bits on any replica/data/fsdp
    split (each slice as many rows as in training)."""
    loss_fn = lm_loss_fn()
    key = jax.random.PRNGKey(0)
    trainer = config.trainer
    if not trainer.invariant:
        return lambda model, batch: loss_fn(model, batch, key)
    split = CanonicalSlices(mesh, trainer.canonical_slices * trainer.accumulation, layout=layout)
    sums = sliced_sums(lambda model, rows, slice_key, frozen: loss_fn(model, rows, slice_key), split)
    return lambda model, batch: sums(model, batch, key)


def _figures(loss_sum: float, tokens: float, num_bytes: float) -> dict[str, float]:
    mean = loss_sum / max(tokens, 1.0)
    return {
        "loss": mean,
        "perplexity": math.exp(min(mean, 50.0)),
        "bits_per_byte": loss_sum / math.log(2) / max(num_bytes, 1.0),
    }
