"""The sample printed at the end of training: the model's continuation of ``trainer.sample_prompt``."""

from __future__ import annotations

import jax

from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.train.data_assembly.tokenizer import load_run_tokenizer
from halyard.train.run_config import TrainerConfig
from halyard.train.step import TrainState


def sample_text(state: TrainState, tokenizer_path: str, config: TrainerConfig) -> str:
    """Continue ``config.sample_prompt`` by ``config.sample_tokens`` tokens (top-k 40 when the temperature is
    above 0, seeded by ``config.seed``) with the inference engine and return the decoded continuation.

    Args:
        state: the trained state (its params are fetched to the host).
        tokenizer_path: the run's tokenizer (a tokenizer.json or a folder).
        config: the ``trainer:`` section.
    """
    tokenizer = load_run_tokenizer(tokenizer_path)
    prompt = tokenizer.encode(config.sample_prompt or "").ids or [0]
    model = jax.device_get(state.params)
    limit = model.position_limit
    context = len(prompt) + config.sample_tokens
    engine = Engine(
        model, EngineConfig.sized_for(sequences=1, context=context if limit is None else min(context, limit))
    )
    params = SamplingParams(
        max_tokens=config.sample_tokens,
        temperature=config.sample_temperature,
        top_k=40 if config.sample_temperature > 0 else 0,
        seed=config.seed,
    )
    (output,) = engine.generate([prompt], params)
    # up to and including a stop token (an imported checkpoint's EOS ids)
    return tokenizer.decode(output.samples[0].token_ids)
