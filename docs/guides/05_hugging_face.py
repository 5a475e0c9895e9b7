# %% [markdown]
# # Hugging Face round trip
#
# Start from a Hugging Face checkpoint folder, continue pretraining it with Halyard, and hand the result
# back to `transformers`. To stay offline, the "downloaded" checkpoint is a small Llama that
# `transformers` initialises at random and saves with `save_pretrained`: the folder has exactly the files
# of a real one (`config.json`, `model.safetensors`).

# %%
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import torch
import transformers

from halyard.export import export_hf, import_hf
from halyard.named import named
from halyard.train import parse_config
from halyard.train.data_assembly.tokenizer import tokenizer_path_of
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.trainer import Trainer

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "hugging-face"
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

hf_config = transformers.LlamaConfig(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
)  # fmt: skip
torch.manual_seed(0)
original = transformers.LlamaForCausalLM(hf_config).eval()
original.save_pretrained(WORK / "hf-original")
print(sorted(path.name for path in (WORK / "hf-original").iterdir()))

# %% [markdown]
# ## Import
#
# `import_hf` reads `config.json` into the matching Halyard family (here `llama`) and the safetensors into
# its parameters. It refuses what it cannot reproduce exactly (a config value transformers would compute
# differently with, a family it does not implement, quantized weights, remote code, pickles unless allowed)
# and ignores keys transformers does not read, so an imported model computes what its authors trained.
# Logits agree with `transformers` on the same tokens:

# %%
config, model = import_hf(WORK / "hf-original")
print(type(config).__name__, "layers:", config.num_layers, "kv heads:", config.num_kv_heads)
tokens = np.random.default_rng(0).integers(0, 512, size=(2, 24))
ours = np.asarray(model(named(tokens, ("batch", "pos"))).array)
with torch.no_grad():
    theirs = original(torch.tensor(tokens)).logits.numpy()
print("max |difference| of logits:", np.abs(ours - theirs).max())
assert np.abs(ours - theirs).max() < 1e-4

# %% [markdown]
# ## Continue pretraining
#
# A run starts from the folder with `trainer.init=hf:PATH`: the model's shape comes from its
# `config.json` (the `model:` section only contributes performance settings), the weights are read
# straight into the run's layout (here FSDP over 8 devices: each device reads only its slices), and the
# optimizer starts fresh. The data are the Python standard library, with a tokenizer of 512 tokens to
# match the checkpoint's vocabulary.

# %%
steps = 4 if SMOKE else 40
run_dir = WORK / "continued"
cache = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve()
cache = cache / ("cache-stdlib-smoke" if SMOKE else "cache-stdlib-512")
overrides = [
    "--trainer.init", f"hf:{WORK / 'hf-original'}",
    "--trainer.run_dir", str(run_dir), "--trainer.steps", str(steps), "--trainer.batch_size", "16",
    "--trainer.log_every", "1", "--trainer.progress", "false",
    "--trainer.layout", "fsdp", "--trainer.mesh.data", "1", "--trainer.mesh.fsdp", "-1", "--trainer.min_shard", "1024",
    "--data.builtin_corpus", "python-stdlib", "--data.max_documents", "30" if SMOKE else "120",
    "--data.tokenizer_vocab_size", "512", "--data.num_workers", "0", "--data.seq_len", "32", "--data.cache_dir", str(cache),
    "--optimizer.learning_rate", "0.003", "--checkpoint.every_steps", str(steps),
]  # fmt: skip
run_config = parse_config(TrainConfig, overrides)
result = Trainer(run_config).fit()
losses = [record["loss"] for record in result.history if "loss" in record]
print("loss:", " ".join(f"{loss:.3f}" for loss in losses))

# %% [markdown]
# ## Export
#
# `export_hf` writes a folder `transformers` loads: `config.json`, `generation_config.json`, the weights
# as safetensors (split into shards above `max_shard_bytes`), and the tokenizer files. A sharded model is
# gathered one tensor at a time, so the host never holds two copies. (`halyard export --run RUN --out DIR`
# does the same from the command line, from a run's latest checkpoint.)

# %%
tokenizer = tokenizer_path_of(run_config.data, run_dir)
folder = export_hf(result.state.params, WORK / "hf-continued", tokenizer=tokenizer)
print(sorted(path.name for path in folder.iterdir()))

# %% [markdown]
# ## Load in transformers and compare
#
# The exported model gives the same logits as the Halyard model it came from, and differs from the
# original (it was trained). Its tokenizer loads with `AutoTokenizer`.

# %%
exported = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
text = "def main():\n    return"
ids = hf_tokenizer(text, return_tensors="pt").input_ids
trained = jax.device_get(result.state.params)
ours = np.asarray(trained(named(ids.numpy(), ("batch", "pos"))).array)
with torch.no_grad():
    theirs = exported(ids).logits.numpy()
    before = original(ids).logits.numpy()
print("exported vs Halyard, max |difference|:", np.abs(ours - theirs).max())
print("exported vs the original checkpoint, max |difference|:", np.abs(theirs - before).max())
assert np.abs(ours - theirs).max() < 1e-4 and np.abs(theirs - before).max() > 1e-3

with torch.no_grad():
    generated = exported.generate(ids, max_new_tokens=12, do_sample=False)
print(repr(hf_tokenizer.decode(generated[0])))

# %% [markdown]
# Supported families (GPT-2, Llama, Mistral, Qwen2, Qwen3, Mixtral, Gemma 1-3, OLMo 2, Phi-3), their options and every refusal are listed
# on the [halyard.export page](../packages/export.md); for a checkpoint from the Hub see
# [Importing a checkpoint you downloaded](../concepts/importing-a-checkpoint.md). Next: [muP](06_mup.md).
