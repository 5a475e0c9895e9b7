"""Continuations of token prompts for the harness's ``generate_until``, by the inference engine.

The engine (`halyard.serve.Engine`) runs the prompts with continuous batching, ``batch_size`` sequences at a
time, over a fixed set of compiled shapes; each prompt draws with its own seed (``seed + its index``), so a
prompt's continuation does not depend on the others in the request list.
"""

from __future__ import annotations

import dataclasses

import jax

from halyard.models import CausalLM
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.shard import Layout


class PromptContinuer:
    """Continues token prompts with one engine built for the model.

    Args:
        model: the model (on ``mesh`` when given).
        batch_size: sequences that run together.
        max_length: the longest prompt plus continuation.
        mesh, layout: the activation layout while sampling (both or neither).
    """

    def __init__(
        self,
        model: CausalLM,
        batch_size: int,
        max_length: int,
        mesh: jax.sharding.Mesh | None = None,
        layout: Layout | None = None,
    ):
        config = EngineConfig.sized_for(sequences=batch_size, context=max_length)
        self.engine = Engine(model, config, mesh=mesh, layout=layout)

    def set_model(self, model: CausalLM) -> None:
        """Continue with ``model``'s weights from now on (the current model's structure and shapes)."""
        self.engine.update_weights(model)

    def __call__(self, prompts: list[list[int]], sampling: SamplingParams, seed: int) -> list[list[int]]:
        """The generated ids of each prompt, in order, up to and including a stop token.

        Args:
            prompts: token ids, each non-empty, each short enough for ``sampling.max_tokens`` more tokens.
            sampling: the sampling rule (``stop_token_ids`` set); its seed is replaced by ``seed + index``.
            seed: the first prompt's seed.
        """
        settings = [dataclasses.replace(sampling, seed=seed + index) for index in range(len(prompts))]
        return [output.samples[0].token_ids for output in self.engine.generate(prompts, settings)]
