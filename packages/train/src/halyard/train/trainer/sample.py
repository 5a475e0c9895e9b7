"""The sample printed at the end of training: the model's continuation of ``trainer.sample_prompt``."""

from __future__ import annotations

import jax
import numpy as np

from halyard.models.sampling import SamplingConfig, generate
from halyard.train.data_assembly.tokenizer import load_run_tokenizer
from halyard.train.run_config import TrainerConfig
from halyard.train.step import TrainState


def sample_text(state: TrainState, tokenizer_path: str, config: TrainerConfig) -> str:
    """Continue ``config.sample_prompt`` by ``config.sample_tokens`` tokens (top-k 40 when the temperature is
    above 0, seeded by ``config.seed``) and return the decoded continuation.

    Args:
        state: the trained state (its params are fetched to the host).
        tokenizer_path: the run's tokenizer (a tokenizer.json or a folder).
        config: the ``trainer:`` section.
    """
    tokenizer = load_run_tokenizer(tokenizer_path)
    prompt = tokenizer.encode(config.sample_prompt or "").ids or [0]
    sampling = SamplingConfig(
        max_new_tokens=config.sample_tokens,
        temperature=config.sample_temperature,
        top_k=40 if config.sample_temperature > 0 else None,
    )
    generation = generate(jax.device_get(state.params), [prompt], sampling, key=jax.random.key(config.seed))
    # up to and including a stop token (an imported checkpoint's EOS ids), not the padding after it
    return tokenizer.decode(np.asarray(generation.tokens)[0, : int(generation.lengths[0])].tolist())
