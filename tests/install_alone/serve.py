"""Smoke use of halyard-serve installed alone: the engine continues two prompts greedily, as the model's
full forward does."""

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import init_model, model_config
from halyard.named import named
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.server import cli  # noqa: F401  (the server imports: fastapi, uvicorn, the chat templates)

sizes = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, max_position=64
)
model = init_model(model_config("llama", num_layers=2, initializer_range=0.3, **sizes), jax.random.key(0))
engine = Engine(model, EngineConfig(page_size=8, num_pages=16, max_running=2, chunk_size=8))
prompts = [[5, 9, 2, 7, 1, 3, 8, 2, 2, 40], [3]]
outputs = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
for prompt, output in zip(prompts, outputs):
    tokens = list(prompt)
    for _ in range(4):
        logits = model(named(jnp.asarray([tokens], jnp.int32), ("batch", "pos"))).unwrap(
            "batch", "pos", "vocab"
        )
        tokens.append(int(np.argmax(np.asarray(logits)[0, -1])))
    assert output.samples[0].token_ids == tokens[len(prompt) :], (output.samples[0].token_ids, tokens)
assert engine.pages.in_use == 0
print("serve ok", [o.samples[0].token_ids for o in outputs])
