"""Log-likelihoods of token windows, batched into bucketed shapes and placed on a mesh like training."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import CausalLM
from halyard.named import named
from halyard.shard import Layout, global_batch_from_local, use_layout
from halyard.train.harness.batching import batch_shards, bucket_for, chunks, length_buckets, round_up


@dataclass(frozen=True)
class Window:
    """Tokens whose last ``scored`` next-token predictions are summed.

    Attributes:
        tokens: the model sees ``tokens[:-1]`` and predicts ``tokens[1:]`` (at most ``max_length + 1``).
        scored: how many of the last predictions count (the continuation's length).
    """

    tokens: list[int]
    scored: int


def token_scorer(vocab_size: int) -> Callable[[CausalLM, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """A jitted ``(model, inputs [rows, L], targets [rows, L]) -> (log p(target), target is the argmax)``.

    Args:
        vocab_size: logits past this id are dropped before the softmax (vocabulary padding rows, which a
            Hugging Face export drops too), so the probabilities are those of the real vocabulary.
    """

    def score(model: CausalLM, inputs: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = model(named(inputs, ("batch", "pos"))).unwrap("batch", "pos", "vocab")[..., :vocab_size]
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        return picked, jnp.argmax(logits, axis=-1) == targets

    return jax.jit(score)


@contextlib.contextmanager
def placement(mesh: jax.sharding.Mesh | None, layout: Layout | None) -> Iterator[None]:
    """The run's activation layout while the model runs (a no-op without a mesh)."""
    if mesh is None or layout is None:
        yield
        return
    with use_layout(layout, mesh):
        yield


@dataclass
class WindowScorer:
    """Sums the log-probabilities of `Window` s, ``batch_size`` at a time.

    Windows are sorted longest first and padded on the right to the bucket of the longest in their batch
    (causal attention never lets a real token see the padding after it); every batch has the same number
    of rows (``batch_size`` rounded up to the mesh's batch devices), so the model compiles once per bucket.

    Attributes:
        model: the model (on ``mesh`` when given).
        vocab_size: see `token_scorer`.
        max_length: the longest input; windows have at most ``max_length + 1`` tokens.
        batch_size: windows per forward pass.
        mesh, layout: where the batch's rows go (both or neither), as the trainer places its batches.
    """

    model: CausalLM
    vocab_size: int
    max_length: int
    batch_size: int
    mesh: jax.sharding.Mesh | None = None
    layout: Layout | None = None

    def __post_init__(self) -> None:
        self._score = token_scorer(self.vocab_size)
        self._buckets = length_buckets(self.max_length)
        self._rows = round_up(self.batch_size, batch_shards(self.mesh, self.layout))

    def __call__(self, windows: list[Window]) -> list[tuple[float, bool]]:
        """``(summed log-probability, every scored token was the argmax)`` per window, in order.

        Raises:
            ValueError: a window longer than ``max_length + 1`` or scoring nothing.
        """
        for window in windows:
            if not 0 < window.scored < len(window.tokens) or len(window.tokens) > self.max_length + 1:
                raise ValueError(
                    f"a window of {len(window.tokens)} tokens scoring {window.scored} does not fit "
                    f"max_length={self.max_length}"
                )
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i].tokens))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(windows)
        for batch in chunks(order, self.batch_size):
            for index, result in zip(batch, self._score_batch([windows[i] for i in batch]), strict=True):
                results[index] = result
        return results

    def _score_batch(self, windows: list[Window]) -> list[tuple[float, bool]]:
        length = bucket_for(max(len(w.tokens) - 1 for w in windows), self._buckets)
        inputs = np.zeros((self._rows, length), np.int32)
        targets = np.zeros((self._rows, length), np.int32)
        for row, window in enumerate(windows):
            size = len(window.tokens) - 1
            inputs[row, :size] = window.tokens[:-1]
            targets[row, :size] = window.tokens[1:]
        batch: Any = {"inputs": inputs, "targets": targets}
        if self.mesh is not None:
            batch = global_batch_from_local(batch, self.mesh, layout=self.layout)
        with placement(self.mesh, self.layout):
            log_probs, is_argmax = self._score(self.model, batch["inputs"], batch["targets"])
        picked, greedy = np.asarray(log_probs, np.float64), np.asarray(is_argmax)
        results = []
        for row, window in enumerate(windows):
            stop = len(window.tokens) - 1
            start = stop - window.scored
            results.append((float(picked[row, start:stop].sum()), bool(greedy[row, start:stop].all())))
        return results
