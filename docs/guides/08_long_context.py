# %% [markdown]
# # Long context: split each sequence over devices
#
# A training step keeps each layer's activations for the backward pass, and they grow with the number of
# tokens in a sequence. Past some length one device cannot hold a single sequence, however the weights
# are sharded. Context parallelism splits the positions of every sequence over the `sequence` axis of the
# mesh: each device holds `seq_len / N` tokens of activations, and attention, the one layer where tokens
# meet, exchanges keys and values between the devices. This guide uses 8 simulated CPU devices:
#
# ```bash
# XLA_FLAGS=--xla_force_host_platform_device_count=8 python docs/guides/08_long_context.py
# ```
#
# It trains the same run with and without a sequence split and gets the same losses, shows why the
# sequence is cut into `2N` chunks before it is split, and plans Llama 3.1 8B at 128k tokens on 8 H200s.

# %%
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from halyard.models.context_order import causal_blocks_per_device, load_balanced_order
from halyard.train import TrainConfig, Trainer, parse_config

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "long_context"
FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"

# %% [markdown]
# ## Two config keys
#
# `trainer.mesh.sequence N` splits every sequence over `N` devices; the other mesh axes still split the
# batch and the weights. `model.context_parallel` chooses how attention sees the keys of the other devices:
#
# | value | what moves | when |
# |---|---|---|
# | `ring` | each device keeps its queries; K/V chunks travel round the devices, the next one sent while this one is computed | any head count; memory for one chunk of K/V at a time |
# | `all_gather` | every device gathers all of K/V | few KV heads (grouped-query attention): K/V is small |
# | `ulysses` | an all-to-all turns the position split into a head split and back | each device's heads and KV heads divide by `N` |
# | `auto` (default) | `ulysses` where the heads divide, else `all_gather` | |
#
# Weights, gradients and optimizer state shard over `sequence` as they do over `fsdp`, so a sequence split
# never replicates the model. Below, the same run trains data-parallel on 8 devices and with its
# sequences split 4 ways (ring attention) on 4 x 2 devices.

# %%
steps = 4 if SMOKE else 20
base = [
    "--model.type", "llama", "--model.vocab_size", "512", "--model.hidden_size", "64",
    "--model.intermediate_size", "128", "--model.num_layers", "2", "--model.num_heads", "4",
    "--model.num_kv_heads", "2", "--model.max_position", "128",
    "--data.builtin_corpus", "python-stdlib", "--data.max_documents", "30" if SMOKE else "120",
    "--data.tokenizer_vocab_size", "512", "--data.num_workers", "0", "--data.seq_len", "64",
    "--data.cache_dir", str(WORK.parent / ("cache-stdlib-smoke-64" if SMOKE else "cache-stdlib-512-64")),
    "--trainer.batch_size", "8", "--trainer.steps", str(steps), "--trainer.log_every", "1",
    "--trainer.progress", "false", "--trainer.plot", "false", "--checkpoint.every_steps", str(steps),
    "--optimizer.learning_rate", "0.01", "--trainer.init", "scratch",
]  # fmt: skip
meshes = {
    "data 8": ["--trainer.mesh.data", "8"],
    "sequence 4 x data 2": ["--trainer.mesh.sequence", "4", "--trainer.mesh.data", "2", "--model.context_parallel", "ring"],
}  # fmt: skip
losses = {}
for name, mesh in meshes.items():
    run_dir = WORK / name.replace(" ", "_")
    shutil.rmtree(run_dir, ignore_errors=True)
    result = Trainer(parse_config(TrainConfig, [*base, *mesh, "--trainer.run_dir", str(run_dir)])).fit()
    losses[name] = [record["loss"] for record in result.history if "loss" in record]
    print(f"{name:20s}", " ".join(f"{value:.5f}" for value in losses[name]))
np.testing.assert_allclose(losses["sequence 4 x data 2"], losses["data 8"], rtol=2e-4)

# %% [markdown]
# The losses agree up to the order of floating-point sums: the split changes where each number is
# computed, not what is computed. Rotary embeddings read each token's own position and the attention
# mask is built from absolute positions, so causal masks, packed documents (segment ids), sliding
# windows and soft-capped logits all behave as on one device.
#
# ## Why the sequence is cut into 2N chunks
#
# Under a causal mask a query attends to the keys before it. Split a sequence into `N` consecutive
# shares and the device holding the last share computes against every key, the first against its own
# only: the slowest device sets the step time. Halyard cuts the sequence into `2N` chunks and gives
# device `i` chunks `i` and `2N-1-i` (an early and a late one) before the model runs, so every device
# computes the same number of visible (query block, key block) pairs. The reorder is applied inside the
# step to the batch's tokens, labels, positions and segment ids: caches and checkpoints do not change,
# and `data.seq_len` must be a multiple of `2N` (preflight says so otherwise).

# %%
length, devices, block = 8192, 4, 128
natural = causal_blocks_per_device(np.arange(length), devices, block)
balanced = causal_blocks_per_device(load_balanced_order(length, devices), devices, block)
print("block pairs per device, consecutive shares:", natural)
print("block pairs per device, 2N chunks:         ", balanced)
assert max(balanced) == min(balanced) and max(natural) > 3 * min(natural)
figure, axes = plt.subplots(figsize=(6, 3))
x = np.arange(devices)
axes.bar(x - 0.2, natural, width=0.4, label="consecutive shares")
axes.bar(x + 0.2, balanced, width=0.4, label="chunks i and 2N-1-i")
axes.set_xticks(x, [f"device {i}" for i in x])
axes.set_ylabel("causal block pairs")
axes.set_title(f"work per device, {length} tokens over {devices} devices")
axes.legend()
figure.tight_layout()
figure.savefig(FIGURES / "08_load_balance.png", dpi=100)

# %% [markdown]
# ![work per device](figures/08_load_balance.png)
#
# ## Plan before you launch
#
# The built-in config `llama-8b-128k` continues Llama 3.1 8B from its Hugging Face checkpoint on
# 131072-token sequences, each split over 8 devices. `halyard plan` compiles its train step for the
# configured mesh on simulated devices and reads XLA's memory analysis: nothing is allocated. Here it
# plans from the config's `model:` section (Llama 3.1 8B's shapes) instead of downloading the
# checkpoint's config.json (`--trainer.init scratch`).

# %%
plan = [
    sys.executable,
    "-m",
    "halyard.train.cli",
    "plan",
    "--config",
    "llama-8b-128k",
    "--accelerator",
    "H200",
]
plan += ["--trainer.init", "scratch"]
# 8 simulated devices; any other XLA flags of this process carry over.
flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in flag]
env = dict(os.environ, XLA_FLAGS=" ".join(["--xla_force_host_platform_device_count=8", *flags]))
for sequence in ["8"] if SMOKE else ["8", "1"]:
    split = ["--trainer.mesh.sequence", sequence] + (
        [] if sequence == "8" else ["--trainer.accumulation", "1"]
    )
    print("$ halyard plan --config llama-8b-128k --accelerator H200", " ".join(split))
    completed = subprocess.run([*plan, *split], env=env, capture_output=True, text=True, check=True)
    print(completed.stdout)
    assert ("fits on H200" in completed.stdout) == (sequence == "8")

# %% [markdown]
# With the sequence split 8 ways a device holds 16384 tokens of each sequence and the step fits; with
# one sequence a device (`sequence 1`: the 8 devices split the batch of 8 instead) the activations of a
# whole 128k sequence do not. See [long context](../concepts/long-context.md) for what each
# implementation sends between devices and how it was measured.
