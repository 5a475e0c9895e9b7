"""`Rollouts`: sampling the completions of a GRPO step with the inference engine, in the training process.

Before each batch of rollouts the trainer's current weights are handed to the engine in memory
(`halyard.serve.Engine.update_weights`: the same arrays, on the same devices; nothing is written or copied,
and the time it takes is reported). Each prompt is one request of ``rl.group_size`` samples, which share the
prompt's pages; its seed is a pure function of the run's seed, the rollout's index and the prompt's position,
so a resumed run samples exactly what the uninterrupted one did (with the engine's deterministic mode).

In deterministic mode the engine's step programs are those of `decode_buckets` (the decoding rows) and one
of the most tokens a step holds, which runs every step with prefill chunks: each program costs a compile, so
fewer buckets start a run sooner, while decoding steps, most of a rollout's, keep programs of their size
(every size computes a row with the same bits: the engine's programs are batch-invariant).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from halyard.models import CausalLM
from halyard.named.nn import ROW_BLOCK
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.shard import Layout
from halyard.train.rl.config import RlConfig
from halyard.train.rl.prompts import Prompt, PromptSet


@dataclass
class Completion:
    """One sampled completion: its tokens, the sampler's log-probability of each (under the distribution it
    was drawn from), and whether it ran out of tokens."""

    tokens: list[int]
    sampler_logprobs: list[float]
    text: str
    truncated: bool


@dataclass
class Group:
    """A prompt and its ``group_size`` completions."""

    index: int
    prompt: Prompt
    completions: list[Completion]


@dataclass
class Sampled:
    """One round of sampling: the groups, and how long the hand-over and the sampling took."""

    groups: list[Group]
    handover_seconds: float
    sampling_seconds: float
    generated_tokens: int


def decode_buckets(max_running: int) -> tuple[int, ...]:
    """The token counts of a deterministic RL engine's step programs below its most (`EngineConfig.
    token_buckets`): powers of two from `ROW_BLOCK` (the training arithmetic computes its products in blocks
    of as many rows, so a smaller program costs as much) below ``max_running``, then ``max_running`` (every
    running completion's decoding token)."""
    sizes = []
    size = ROW_BLOCK
    while size < max_running:
        sizes.append(size)
        size *= 2
    return (*sizes, max_running)


def rollout_seed(seed: int, rollout: int, position: int) -> int:
    """The engine seed of the prompt at ``position`` of rollout ``rollout`` (a 63-bit integer)."""
    mixed = np.random.SeedSequence([seed, rollout, position]).generate_state(2, np.uint32)
    return (int(mixed[0]) << 31) ^ int(mixed[1])


class Rollouts:
    """Samples completions of prompts with an engine over the trainer's devices.

    Args:
        model: a model of the run's structure (the first weights handed over).
        config: the ``rl:`` section.
        prompts: the run's prompts.
        context: the longest prompt plus ``rl.max_new_tokens``.
        decode: the tokenizer's decode (completion texts for the rewards).
        eos_token_ids: the ids that end a completion.
        seed: the run's seed (``trainer.seed``).
        mesh, layout: the trainer's mesh and layout (the engine runs on them: no resharding).
    """

    def __init__(
        self,
        model: CausalLM,
        config: RlConfig,
        prompts: PromptSet,
        *,
        context: int,
        decode: Any,
        eos_token_ids: tuple[int, ...],
        seed: int,
        mesh: Any = None,
        layout: Layout | None = None,
    ):
        self.config = config
        self.prompts = prompts
        self.seed = seed
        engine_config = EngineConfig.sized_for(
            sequences=config.max_running,
            context=context,
            page_size=config.page_size,
            max_n=config.group_size,  # a prompt's group is one request, its samples in the pool at once
            chunk_size=max(64, config.page_size),
            max_prefill_rows=4,
            deterministic=config.deterministic,
            # One decoding program of every running row: rollouts fill the batch, so one dispatch a step.
            deterministic_rows=config.max_running,
            training_arithmetic=config.deterministic,  # the trainer's arithmetic: log-probs bitwise
            token_buckets=decode_buckets(config.max_running) if config.deterministic else (),
            prefix_cache=True,
        )
        self.engine = Engine(
            model, engine_config, decode=decode, eos_token_ids=eos_token_ids, mesh=mesh, layout=layout
        )

    def sample(self, rollout: int, first_position: int, count: int, model: CausalLM) -> Sampled:
        """Sample ``group_size`` completions of the ``count`` prompts from ``first_position`` on, with
        ``model``'s weights.

        Args:
            rollout: the rollout's index (its seeds).
            first_position: the first prompt's position in the run's order.
            count: prompts to sample.
            model: the weights to sample with (handed over in memory).
        """
        started = time.perf_counter()
        self.engine.update_weights(model)
        handed_over = time.perf_counter()
        chosen = self.prompts.batch(first_position, count)
        rl = self.config
        settings = [
            SamplingParams(
                max_tokens=rl.max_new_tokens,
                temperature=rl.temperature,
                top_p=rl.top_p,
                n=rl.group_size,
                seed=rollout_seed(self.seed, rollout, first_position + offset),
            )
            for offset in range(count)
        ]
        outputs = self.engine.generate([list(prompt.tokens) for _, prompt in chosen], settings)
        groups = []
        generated = 0
        for (index, prompt), output in zip(chosen, outputs, strict=True):
            completions = [
                Completion(
                    sample.token_ids, sample.sampled_logprobs, sample.text, sample.finish_reason == "length"
                )
                for sample in output.samples
            ]
            generated += sum(len(c.tokens) for c in completions)
            groups.append(Group(index, prompt, completions))
        return Sampled(groups, handed_over - started, time.perf_counter() - handed_over, generated)
