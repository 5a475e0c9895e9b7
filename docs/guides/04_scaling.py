# %% [markdown]
# # Scale one run across many devices
#
# A run is spread over devices by two values of the config: `trainer.mesh` (how many devices each kind of
# parallelism gets) and `trainer.layout` (which logical axes of the weights and activations are split
# over which mesh axes). The model code does not change. This guide uses 8 simulated CPU devices, so it
# runs anywhere:
#
# ```bash
# XLA_FLAGS=--xla_force_host_platform_device_count=8 python docs/guides/04_scaling.py
# ```
#
# It compares data parallelism, FSDP and tensor parallelism: where each weight lives, and that all three
# train to the same losses; restores a checkpoint written under one layout into another; pipelines the
# layers over the `stage` axis; and finally runs one training job as two processes, as on two hosts.

# %%
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from halyard.shard import Layout, MeshSpec
from halyard.shard.mesh import mesh_axis_sizes
from halyard.train import TrainConfig, Trainer, parse_config, read_jsonl

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "scaling"
FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
print(jax.device_count(), "devices:", jax.devices()[:2], "...")
assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"

# %% [markdown]
# ## One model, three layouts
#
# A small Llama, written once. Its weights are `NamedArray`s whose axes are called `embed`, `heads`,
# `kv_heads`, `head_size`, `mlp`, `vocab` and `layers`; a layout maps those names to mesh axes.

# %%
model_keys = {
    "type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2,
    "num_heads": 4, "num_kv_heads": 2, "max_position": 64,
}  # fmt: skip
layouts = {
    "data_parallel": MeshSpec(data=8),
    "fsdp": MeshSpec(data=1, fsdp=8),
    "tensor_parallel": MeshSpec(data=4, tensor=2),
}
model_args = [arg for key, value in model_keys.items() for arg in (f"--model.{key}", str(value))]
model_config = parse_config(TrainConfig, model_args).model
abstract = jax.eval_shape(model_config.init, jax.random.key(0))  # shapes only: nothing is allocated

placements = {}
for name, spec in layouts.items():
    layout, mesh = Layout.preset(name, min_shard=1024), spec.build()
    print(f"--- {name} on mesh {dict((k, v) for k, v in mesh_axis_sizes(mesh).items() if v > 1)}")
    print(layout.describe(abstract, mesh))
    placements[name] = (layout.plan(abstract, mesh), mesh_axis_sizes(mesh))

# %% [markdown]
# Read the `spec` column as "which mesh axis splits each named dimension": data parallelism keeps a full
# copy of every weight on every device; FSDP splits each weight over all 8 devices along its first
# dimension that divides (and gathers it just in time for the matmul); tensor parallelism splits heads,
# MLP and vocabulary over 2 devices, and the 4 data-parallel groups each hold a copy. Weights with fewer
# than `min_shard` elements (the norms) stay replicated: splitting them would cost more than it saves.

# %%
paths = [p.path for p in placements["data_parallel"][0]]
short = [path.replace("transformer.", "").replace(".array", "").replace(".weight", "") for path in paths]
figure, ax = plt.subplots(figsize=(7.5, 0.32 * len(paths) + 1.2))
height = 0.8 / len(layouts)
for i, (name, (plan, sizes)) in enumerate(placements.items()):
    kib = [p.bytes_per_device(sizes) / 1024 for p in plan]
    ax.barh(np.arange(len(paths)) + i * height, kib, height, label=name)
ax.set_yticks(np.arange(len(paths)) + height, short)
ax.invert_yaxis()
ax.set_xlabel("KiB of the weight held by each device")
ax.set_title("Where each weight lives: bytes per device, 8 devices")
ax.legend()
figure.tight_layout()
figure.savefig(FIGURES / "04_weights_per_device.png", dpi=100)

# %% [markdown]
# ![Bytes per device of each weight under data parallel, FSDP and tensor parallel](figures/04_weights_per_device.png)
#
# ## The same training under each layout
#
# Now we train the same run under each layout: only `trainer.layout` and `trainer.mesh` differ. The
# batches are the same (a batch is a function of the data, the seed and the step, never of the device
# count), so the losses agree up to the order of floating-point sums.

# %%
steps = 2 if SMOKE else 30  # smoke: the second step's loss is the first update's, under each layout
base = [
    *model_args,
    "--data.builtin_corpus", "python-stdlib", "--data.max_documents", "30" if SMOKE else "120",
    "--data.tokenizer_vocab_size", "512", "--data.num_workers", "0", "--data.seq_len", "32",
    "--data.cache_dir", str(WORK.parent / ("cache-stdlib-smoke" if SMOKE else "cache-stdlib-512")),
    "--trainer.batch_size", "16", "--trainer.steps", str(steps), "--trainer.log_every", "1",
    "--trainer.progress", "false", "--trainer.min_shard", "1024", "--checkpoint.every_steps", str(steps),
    "--optimizer.learning_rate", "0.01",
]  # fmt: skip


def layout_args(name: str) -> list[str]:
    sizes = {key: value for key, value in layouts[name].__dict__.items() if isinstance(value, int)}
    mesh = [arg for key, value in sizes.items() for arg in (f"--trainer.mesh.{key}", str(value))]
    return ["--trainer.layout", name, *mesh]


results = {}
for name in layouts:
    run = ["--trainer.run_dir", str(WORK / name), "--trainer.init", "scratch"]
    if (WORK / name).exists():
        import shutil

        shutil.rmtree(WORK / name)
    results[name] = Trainer(parse_config(TrainConfig, [*base, *layout_args(name), *run])).fit()

losses = {
    name: [record["loss"] for record in result.history if "loss" in record]
    for name, result in results.items()
}
for name, values in losses.items():
    print(f"{name:16s}", " ".join(f"{v:.5f}" for v in values))
    np.testing.assert_allclose(values, losses["data_parallel"], rtol=2e-5)
print("equal losses under every layout")

# %% [markdown]
# ## A checkpoint written in one layout, restored into another
#
# Checkpoints store each array whole (by its path in the state), not per device. So the FSDP run's
# checkpoint restores into a tensor-parallel run on a different mesh: `trainer.init=checkpoint:PATH`
# points at it, and each device reads only its own slices.

# %%
target = WORK / "restored_tp"
if target.exists():
    import shutil

    shutil.rmtree(target)
restore = ["--trainer.run_dir", str(target), "--trainer.init", f"checkpoint:{WORK / 'fsdp'}"]
restored = Trainer(parse_config(TrainConfig, [*base, *layout_args("tensor_parallel"), *restore])).fit()
fsdp_state = jax.device_get(results["fsdp"].state.params)
tp_state = jax.device_get(restored.state.params)
for a, b in zip(jax.tree.leaves(fsdp_state), jax.tree.leaves(tp_state)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
embedding = jax.tree.leaves(restored.state.params)[0]
print(
    "restored step",
    int(restored.state.step),
    "bit for bit; a weight is now split as",
    embedding.sharding.spec,
)

# %% [markdown]
# ## A pipeline over the `stage` axis
#
# When one group of devices cannot hold a model's layers, or the links between groups are too slow for
# FSDP, the layers are cut into stages instead: `trainer.mesh.stage S` gives each group of devices
# `num_layers / S` consecutive layers, every batch is cut into `model.pipeline_microbatches` M >= S
# microbatches, and each device group passes a microbatch's activations to the next one while it takes
# the next microbatch. A stage idles for `S - 1` of the `M + S - 1` steps of the schedule (the bubble;
# `model.pipeline_repeats` R > 1 gives each group R smaller pieces, circularly, and shrinks it to
# `(S - 1) / (R M + S - 1)`). The weights keep their tree: a pipelined run's checkpoint restores onto any
# mesh. Here the two layers are two stages of 4 data-parallel devices each, and the losses are those of
# the data-parallel run above.

# %%
target = WORK / "pipeline"
if target.exists():
    import shutil

    shutil.rmtree(target)
pipeline = [
    "--trainer.mesh.stage",
    "2",
    "--trainer.mesh.data",
    "4",
    "--model.pipeline_microbatches",
    "2",
    "--trainer.min_shard",
    "1",
]
piped = Trainer(parse_config(TrainConfig, [*base, *pipeline, "--trainer.run_dir", str(target)])).fit()
piped_losses = [record["loss"] for record in piped.history if "loss" in record]
print("stage 2 x data 4", " ".join(f"{v:.5f}" for v in piped_losses))
np.testing.assert_allclose(piped_losses, losses["data_parallel"], rtol=2e-4)

# %% [markdown]
# ## Two processes on one machine
#
# On a cluster, every host runs the same command; three environment variables tell each process where the
# coordinator (process 0) listens, how many processes there are and which one it is. (Under Slurm or
# Open MPI they are detected.) Here two processes on this machine, with 4 simulated devices each, form
# one 8-device FSDP run. Each process loads only its half of every batch; process 0 writes the metrics
# and the checkpoint's commit marker.

# %%
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
two = WORK / "two_processes"
if two.exists():
    import shutil

    shutil.rmtree(two)
command = [sys.executable, "-m", "halyard.train.cli", "train", *base, *layout_args("fsdp")]
command += ["--trainer.run_dir", str(two)]
processes = []
for process_id in range(2):
    env = dict(
        os.environ,
        HALYARD_COORDINATOR=f"127.0.0.1:{port}",
        HALYARD_NUM_PROCESSES="2",
        HALYARD_PROCESS_ID=str(process_id),
        # 4 devices each; any other XLA flags of this process carry over.
        XLA_FLAGS=" ".join(
            ["--xla_force_host_platform_device_count=4"]
            + [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in flag]
        ),
    )
    processes.append(
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    )
outputs = [process.communicate(timeout=600)[0] for process in processes]
for process_id, (process, output) in enumerate(zip(processes, outputs)):
    lines = output.strip().splitlines()  # process 0 reports the run; the others print only their problems
    print(f"process {process_id}: exit {process.returncode}; last line: {lines[-1] if lines else '(none)'}")
    assert process.returncode == 0, output[-3000:]
two_losses = [record["loss"] for record in read_jsonl(two / "metrics.jsonl") if "loss" in record]
np.testing.assert_allclose(two_losses, losses["fsdp"], rtol=2e-5)
print("two processes x 4 devices: the same losses as one process x 8 devices")

# %% [markdown]
# The same in a shell, one line per host (or both on one machine, as here):
#
# ```bash
# HALYARD_COORDINATOR=10.0.0.1:12345 HALYARD_NUM_PROCESSES=2 HALYARD_PROCESS_ID=0 train --config my_run.yaml
# HALYARD_COORDINATOR=10.0.0.1:12345 HALYARD_NUM_PROCESSES=2 HALYARD_PROCESS_ID=1 train --config my_run.yaml
# ```
#
# More layouts (`fsdp_tensor`, `expert_parallel`), custom rules and multi-slice meshes are in the
# [halyard.shard package page](../packages/shard.md). Next: [Hugging Face round trip](05_hugging_face.md).
