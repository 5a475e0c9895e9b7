# %% [markdown]
# # Reinforcement learning with verifiable rewards
#
# `trainer.objective: grpo` trains a policy on prompts whose answers a program can check. Each step the
# inference engine samples a group of completions of every prompt with the current weights (in the training
# process, the weights handed over in memory), reward functions score them, and the policy loss raises the
# likelihood of the completions that beat their group. This guide runs the built-in `grpo-demo`: a tiny
# Llama that starts from random weights and learns, by reinforcement alone, to answer the largest of four
# digits:
#
# ```bash
# python docs/guides/10_rl.py          # the whole demo: 300 steps, about 5 minutes on 2 CPU cores
# ```

# %%
import json
import os
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from halyard.named.nn import unfuse_multiply_add
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.train import TrainConfig, Trainer, load_run_model, parse_config
from halyard.train.cli import resolve_config_paths

# Before JAX starts: XLA without fused multiply-adds, what the `train` command sets up for rl.deterministic
# (the default), so the engine's log-probs equal the trainer's bit for bit (see "What the run logs").
UNFUSED = unfuse_multiply_add()

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "rl"
FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The task, the reward and the config
#
# The `max-digit` prompt corpus holds records `{"prompt": "3957>", "answer": "9"}`; your own are records
# of any source Halyard reads (jsonl, parquet, ...) with a prompt (a string or chat messages, rendered with
# the tokenizer's chat template) and an answer. The `exact` reward gives 1 when the completion is the
# answer; `math` (math-verify), `format:REGEX` and your own `module:function` are the others. The config
# (`halyard config show grpo-demo` prints it, each key explained):
#
# ```yaml
# trainer: {objective: grpo, batch_size: 128}      # 16 prompts x 8 completions a step
# data: {format: prompts, builtin_corpus: max-digit, validation_fraction: 0.02}
# rl: {loss: grpo, group_size: 8, max_new_tokens: 2, rewards: [exact]}
# ```

# %%
steps = 2 if SMOKE else 300
run_dir = WORK / "grpo-demo"
shutil.rmtree(run_dir, ignore_errors=True)
args = ["--config", "grpo-demo", "--trainer.run_dir", str(run_dir), "--trainer.steps", str(steps)]
args += ["--trainer.log_every", "1", "--trainer.eval_every", str(steps // 2), "--trainer.progress", "false"]
result = Trainer(parse_config(TrainConfig, resolve_config_paths(args))).fit()

# %% [markdown]
# ## What the run logs
#
# Every step logs the rewards (their mean and deviation, for each reward function too), the share of
# groups whose completions all scored alike (they teach nothing), `pass@8`, completion lengths, the
# policy's entropy, clip fractions, the difference between the engine's and the trainer's log-probability
# of each sampled token, and the time of the rollouts and of the hand-over. With `rl.deterministic` (the
# default) that difference is 0: the engine and the trainer compute with the same batch-invariant arithmetic
# (`halyard.named.nn.batch_invariant`), in a process where XLA fuses no multiply-adds (`train` starts it so;
# a program of your own calls `unfuse_multiply_add()` before JAX starts, as above). `eval/reward_mean` is the
# greedy reward on held-out prompts, before the first step and every `trainer.eval_every` steps.

# %%
records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
rewards = [(r["step"], r["reward/mean"]) for r in records if "reward/mean" in r]
held_out = [(r["step"], r["eval/reward_mean"]) for r in records if "eval/reward_mean" in r]
print("held-out greedy reward by step:", held_out)
last = result.last_metrics
print(
    {
        k: round(last[k], 4)
        for k in ("sampling/sampling_logp_difference/max", "rollout/handover_seconds", "entropy")
    }
)
assert last["sampling/sampling_logp_difference/max"] == 0.0 or not UNFUSED  # the sampler is the trainer
if not SMOKE:
    assert held_out[0][1] <= 0.3 and held_out[-1][1] >= 0.9
figure, axes = plt.subplots(figsize=(6, 3))
axes.plot(*zip(*rewards), label="sampled completions (temperature 1)")
axes.plot(*zip(*held_out), "o-", label="held-out prompts, greedy")
axes.set_xlabel("step")
axes.set_ylabel("mean reward")
axes.set_ylim(0, 1.05)
axes.legend()
figure.tight_layout()
figure.savefig(FIGURES / "10_reward.png", dpi=100)

# %% [markdown]
# ![the reward rising](figures/10_reward.png)
#
# ## Using the trained policy
#
# The checkpoint is a model like any other: `halyard serve --run runs/grpo-demo` serves it over OpenAI's
# API, and in Python the engine runs it directly.

# %%
loaded = load_run_model(run_dir)
engine = Engine(
    loaded.model, EngineConfig(page_size=16, num_pages=16, max_running=4, chunk_size=16, max_context=64)
)
questions = ["3957>", "1204>", "8086>", "5551>"]
digits = {str(d): d + 1 for d in range(10)} | {">": 11}
outputs = engine.generate(
    [[digits[c] for c in q] for q in questions], SamplingParams(max_tokens=2, temperature=0.0)
)
for question, output in zip(questions, outputs):
    answer = "".join(str(t - 1) for t in output.samples[0].token_ids if 1 <= t <= 10)
    print(f"{question} {answer}   (largest digit: {max(question[:-1])})")
