"""Smoke use of halyard-export installed alone: export a Llama to a Hugging Face folder and read it back."""

import json
import sys
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import load_file

from halyard.export import export_hf, import_hf
from halyard.models import LmBatch, init_model, model_config

folder = Path(sys.argv[1]) / "hf"
sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2)
model = init_model(model_config("llama", num_layers=2, **sizes), jax.random.key(0))
export_hf(model, folder)
config = json.loads((folder / "config.json").read_text())
assert config["model_type"] == "llama" and config["num_hidden_layers"] == 2, config
tensors = load_file(str(folder / "model.safetensors"))
assert tensors["model.embed_tokens.weight"].shape == (64, 32), tensors["model.embed_tokens.weight"].shape

_, reloaded = import_hf(folder)
tokens = LmBatch.from_tokens(np.random.default_rng(0).integers(0, 64, size=(2, 9))).tokens
forward = jax.jit(lambda m, t: m(t).array)
np.testing.assert_array_equal(np.asarray(forward(reloaded, tokens)), np.asarray(forward(model, tokens)))
print("export ok", sorted(p.name for p in folder.iterdir()))
