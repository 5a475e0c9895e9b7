# %% [markdown]
# # Train your first model
#
# `make demo` runs `train --config demo`: a small Llama trained on the Python standard library's sources
# (present on every machine, so no download), with a tokenizer trained on the same corpus. This guide
# runs a shortened version of it from Python, looks into the run directory, kills the run with
# `kill -9` in the middle, resumes it, plots the loss and samples from the model.

# %%
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from halyard.train import (
    TrainConfig,
    Trainer,
    builtin_configs,
    parse_config,
    read_jsonl,
    resolve_config_paths,
)
from halyard.train.cli import main

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve()
FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The demo config
#
# A config is YAML with six sections: `model` (the family by `type:` and its shape), `data` (where the
# text comes from and how it is cut), `optimizer`, `trainer` (steps, batch, mesh, logging, evaluation,
# sampling), `checkpoint` and `trackers`. Every key is listed in the
# [config reference](../concepts/config.md); `train --help` prints the same.

# %%
print(builtin_configs()["demo"].read_text())

# %% [markdown]
# We keep the demo's settings and override a few keys to make it quick, exactly as on the command line
# (`train --config demo --trainer.steps 60 ...`). `parse_config` is the parser the `train` command uses,
# and `Trainer(config).fit()` is the code path it runs. The token cache goes to a folder shared with the
# other guides, so it is built once.

# %%
run_dir = WORK / "first-model"
if SMOKE:
    size = ["--model.hidden_size", "32", "--model.intermediate_size", "64", "--model.num_layers", "2"]
    size += ["--model.vocab_size", "512", "--data.tokenizer_vocab_size", "512", "--data.max_documents", "30"]
    size += ["--data.seq_len", "32", "--trainer.batch_size", "8", "--model.max_position", "64"]
    steps, every = 40, 10
else:
    size = ["--model.hidden_size", "64", "--model.intermediate_size", "192", "--data.max_documents", "120"]
    steps, every = 150, 50
overrides = [
    *size,
    "--trainer.run_dir", str(run_dir),
    "--data.cache_dir", str(WORK / ("cache-stdlib-smoke" if SMOKE else "cache-stdlib")),
    "--trainer.steps", str(steps),
    "--trainer.log_every", "2" if SMOKE else "5",
    "--trainer.eval_every", str(every),
    "--data.validation_fraction", "0.05",
    "--checkpoint.every_steps", str(every),
    "--trainer.progress", "false",
    "--data.num_workers", "0",  # tokenize in this process: the corpus is small
]  # fmt: skip
config = parse_config(TrainConfig, resolve_config_paths(["--config", "demo", *overrides]))
print(config.model)
print("steps:", config.trainer.steps, "batch:", config.trainer.batch_size, "x", config.data.seq_len, "tokens")

# %% [markdown]
# ## A run killed with `kill -9`
#
# We start the same run with the `train` command in another process, wait until its first checkpoint is
# complete and a few more steps are done, and kill it without warning: no chance to save or clean up. (A polite `SIGTERM`, as sent by a
# preempting scheduler, would make it save a checkpoint and exit with code 143.)

# %%
if run_dir.exists():
    import shutil

    shutil.rmtree(run_dir)
command = [sys.executable, "-m", "halyard.train.cli", "train", "--config", "demo", *overrides]
process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
markers = run_dir / "checkpoints"
deadline = time.monotonic() + 600


def logged_past_a_checkpoint() -> bool:
    """True once a checkpoint is complete and a later step was logged: the moment to pull the plug."""
    complete = [
        int(p.parent.name.removeprefix("step_")) for p in markers.glob("step_*/halyard_checkpoint.json")
    ]
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return bool(complete) and any(
        f'"step": {step}' in " ".join(lines) for step in range(min(complete) + 1, steps)
    )


while not logged_past_a_checkpoint() and process.poll() is None:
    if time.monotonic() > deadline:
        raise TimeoutError("no checkpoint after 10 minutes")
    time.sleep(0.05)
process.send_signal(signal.SIGKILL)
process.wait()
print("exit code:", process.returncode)  # -9: killed
before_kill = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}
killed_at = max(before_kill)
complete = sorted(
    int(p.parent.name.removeprefix("step_")) for p in markers.glob("step_*/halyard_checkpoint.json")
)
print("last step logged before the kill:", killed_at, "complete checkpoints:", complete)

# %% [markdown]
# ## The run directory
#
# Everything the run writes is under `trainer.run_dir`: the resolved config (it parses back to the same
# config), the metrics as JSON lines (and TensorBoard events) and the checkpoints. The token cache and the
# tokenizer trained on the corpus live in `data.cache_dir` (by default `<run_dir>/cache`). A
# checkpoint counts only when its marker `halyard_checkpoint.json` is written, last, after every array
# file; a step folder without it (the kill may interrupt a save) is never restored.

# %%
for path in sorted(run_dir.rglob("*")):
    depth = len(path.relative_to(run_dir).parts)
    if depth <= 2 and "arrays" not in path.parts:
        print("  " * (depth - 1) + path.name + ("/" if path.is_dir() else ""))

# %% [markdown]
# ## Resuming
#
# Running the same config again resumes (`trainer.init: auto`): it restores the latest complete checkpoint
# (step, weights, optimizer state, random key) and continues with exactly the batches it would have seen,
# because a batch is a pure function of (data, seed, step). Here we resume from Python; `train --config
# demo ...` would do the same.

# %%
result = Trainer(config).fit()
resumed_from = complete[-1]
print("resumed from step", resumed_from, "and finished at step", int(result.state.step))
assert min(record["step"] for record in result.history) > resumed_from and int(result.state.step) == steps

# %% [markdown]
# ## Metrics
#
# Each tracker receives the same metrics every `trainer.log_every` steps: `loss`, `grad_norm`,
# `param_norm`, `update_norm`, `learning_rate`, `tokens_per_second`, `mfu`, and, with a validation split,
# `eval_loss`, `eval_perplexity` and `eval_bits_per_byte`. The `jsonl` tracker writes them to
# `metrics.jsonl`; the resumed run replaced the lines the killed one wrote after its last checkpoint. It
# recomputed those steps with exactly the same losses, because the resumed state and batches are the same.

# %%
records = read_jsonl(run_dir / "metrics.jsonl")
print({key: round(value, 4) for key, value in [r for r in records if "loss" in r][-1].items()})
train = {r["step"]: r["loss"] for r in records if "loss" in r}
evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
repeated = sorted(step for step in before_kill if step > resumed_from)
print("steps computed twice:", repeated)
assert all(before_kill[step] == train[step] for step in repeated)

figure, ax = plt.subplots(figsize=(6.4, 3.6))
ax.plot(*zip(*sorted(train.items())), label="training loss", color="tab:blue")
ax.plot(*zip(*sorted(before_kill.items())), "x", label="logged by the killed process", color="tab:red")
if evals:
    ax.plot(*zip(*evals), "o", label="validation loss", color="tab:orange")
ax.axvline(killed_at, color="gray", linestyle="--", label="kill -9, then resume")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy (nats per token)")
ax.set_title("A small Llama on the Python standard library")
ax.legend()
figure.tight_layout()
figure.savefig(FIGURES / "02_loss_curve.png", dpi=100)

# %% [markdown]
# ![Training and validation loss over the steps; the kill leaves no trace in the curve](figures/02_loss_curve.png)
#
# ## Sampling
#
# With `trainer.sample_prompt` set (the demo uses `"def "`), `fit` ends by continuing the prompt greedily.
# From the command line, `halyard generate --run RUN_DIR --prompt "def "` samples from the latest
# checkpoint and `halyard eval --run RUN_DIR` reports the validation loss, perplexity and bits per byte.
# Here the `halyard` command runs in this process, through its entry point `halyard.train.cli.main`.

# %%
print(repr(config.trainer.sample_prompt + (result.sample or "")))
assert main(["generate", "--run", str(run_dir), "--prompt", "import ", "--max-new-tokens", "24"]) == 0

# %% [markdown]
# After this few steps the model has learned little more than frequent tokens (indentation, common
# words), so the sample repeats them; the demo's 300 steps of a wider model get to Python-looking lines,
# and the same config scaled up (`model.hidden_size`, `model.num_layers`, `trainer.steps`) is a real run.
# Next: [your own data](03_your_data.md).
