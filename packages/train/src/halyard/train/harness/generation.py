"""Continuations of token prompts with `halyard.models.sampling.generate`, in bucketed shapes.

`generate` left-pads a batch to its longest prompt, so its compiled shape follows the prompts. Each batch
here gets one extra filler row whose length is the bucket of the batch's longest prompt, and filler rows
up to a fixed row count: the sampler then compiles once per (bucket, ``max_new_tokens``, sampling rule)
rather than once per batch. The filler rows' continuations are dropped; padding never changes a real
row's tokens (segment ids and positions keep each row as it would be alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from halyard.models import CausalLM
from halyard.models.sampling import SamplingConfig, generate
from halyard.shard import Layout
from halyard.train.harness.batching import batch_shards, bucket_for, chunks, length_buckets, round_up
from halyard.train.harness.scoring import placement


@dataclass
class PromptContinuer:
    """Continues token prompts, ``batch_size`` at a time.

    Attributes:
        model: the model (on ``mesh`` when given).
        batch_size: prompts per batch (each batch has ``batch_size + 1`` rows, rounded up to the mesh's batch
            devices: one or more filler rows fix the padded length).
        filler_token: the id filler rows are made of (their output is dropped).
        mesh, layout: the activation layout while sampling (both or neither).
    """

    model: CausalLM
    batch_size: int
    filler_token: int
    mesh: jax.sharding.Mesh | None = None
    layout: Layout | None = None

    def __call__(
        self, prompts: list[list[int]], sampling: SamplingConfig, max_prompt_length: int, seed: int
    ) -> list[list[int]]:
        """The generated ids of each prompt, in order, up to and including a stop token.

        Args:
            prompts: token ids, each non-empty and at most ``max_prompt_length`` long.
            sampling: the sampling rule (``stop_tokens`` set).
            max_prompt_length: the longest prompt allowed (the last length bucket).
            seed: PRNG seed of the first batch (the next batches use ``seed + 1``, ...).
        """
        buckets = length_buckets(max_prompt_length)
        rows = round_up(self.batch_size + 1, batch_shards(self.mesh, self.layout))
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[list[int]] = [[] for _ in prompts]
        for number, batch in enumerate(chunks(order, self.batch_size)):
            length = bucket_for(max(len(prompts[i]) for i in batch), buckets)
            filler = [[self.filler_token] * length] + [[self.filler_token]] * (rows - len(batch) - 1)
            with placement(self.mesh, self.layout):
                generation = generate(
                    self.model,
                    [prompts[i] for i in batch] + filler,
                    sampling,
                    key=jax.random.key(seed + number),
                )
            tokens, lengths = np.asarray(generation.tokens), np.asarray(generation.lengths)
            for row, index in enumerate(batch):
                results[index] = tokens[row, : lengths[row]].tolist()
        return results
