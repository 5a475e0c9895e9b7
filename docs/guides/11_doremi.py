# %% [markdown]
# # DoReMi: learn the data mixture
#
# A run on a mixture (`data.mixture`) trains on its sources in the proportions you give. Which proportions?
# DoReMi (Xie et al. 2023, "Optimizing Data Mixtures Speeds Up Language Model Pretraining") learns them with
# two small models:
#
# 1. a **reference** model trained on the initial mixture;
# 2. a **proxy** model of the same shape trained with Group DRO: at every step, each source's (domain's)
#    *excess loss* is the proxy's per-token loss minus the reference's, clipped at 0 and averaged over that
#    domain's tokens in the batch; the domain weights take an exponentiated-gradient step on it
#    (`w <- softmax(log w + excess)`) and are mixed with the uniform distribution (1e-3); the proxy's loss is
#    the weighted sum of the domains' mean losses. A domain the reference already does well on, or one
#    nobody can learn (noise), has no excess loss: its weight falls. A domain where the proxy lags behind
#    what the reference shows is learnable gets weight.
# 3. The answer is the **average of the weights over the proxy's steps**: the main run trains on it.
#
# `halyard doremi --config C` does all three steps (`--main` trains the main run too):
#
# ```bash
# halyard doremi --config doremi-demo --main     # 3-4 minutes on 2 CPU cores
# python docs/guides/11_doremi.py                # this guide: the same, and its figures
# ```

# %%
import json
import os
import shutil
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "doremi"
FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The demo: four domains of different learnability
#
# `doremi-demo` mixes four built-in corpora, written on every machine without a network, in equal shares:
# Python source (`python-stdlib`), English prose (`english-prose`: the paragraphs of Python's own reference
# documentation), a repetitive domain (`repetitive`: the alphabet over and over, learned at once) and noise
# (`noise`: random binary digits; past giving 0 and 1 half the probability each there is nothing to learn). A token per byte
# (`data.tokenizer: bytes`) and a 2-layer Llama keep it to minutes on a laptop:
#
# ```yaml
# data:
#   tokenizer: bytes
#   mixture:
#     sources:
#       python: {builtin_corpus: python-stdlib, max_documents: 120}
#       prose: {builtin_corpus: english-prose}
#       repetitive: {builtin_corpus: repetitive}
#       noise: {builtin_corpus: noise}
#     weights: {python: 1, prose: 1, repetitive: 1, noise: 1}
# trainer: {steps: 300, batch_size: 16}
# ```

# %%
steps = 12 if SMOKE else 300  # smoke: past the 10 warm-up steps
folder = WORK / "doremi-demo"
shutil.rmtree(folder, ignore_errors=True)
command = ["halyard", "doremi", "--config", "doremi-demo", "--main", "--trainer.run_dir", str(folder)]
command += ["--trainer.steps", str(steps), "--trainer.eval_every", str(max(steps // 4, 1))]
command += ["--trainer.progress", "false"]
if SMOKE:  # smoke: 20 documents of each domain, tokenized in seconds
    for name in ("python", "prose", "repetitive", "noise"):
        command += [f"--data.mixture.sources.{name}.max_documents", "20"]
done = subprocess.run(command, capture_output=True, text=True, check=True)
print("\n".join(line for line in done.stdout.splitlines() if line.startswith(("doremi", "  "))))

# %% [markdown]
# The folder holds `reference/`, `proxy/` and `main/` (three ordinary runs: each resumes after a kill, and
# `halyard doremi` keeps a finished one), `domain_weights.json` (the average and final weights, the data each
# belongs to, the reference and the proxy runs) and `main.yaml`, the main run's config: the reference's, with
# the learned weights. `halyard doremi` prints the command that trains it (`train --config .../main.yaml`);
# with `--main` it trains it and compares each domain's validation loss with the reference's, the same model
# trained on the initial mixture for the same steps and tokens.

# %%
learned = json.loads((folder / "domain_weights.json").read_text())
print({name: round(weight, 4) for name, weight in learned["average"].items()})
if not SMOKE:  # a few steps are too few for the weights to settle
    assert learned["average"]["noise"] < 0.25 / 5  # below a fifth of the uniform weight


def last_validation(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "eval_loss" in row][-1]


learnable = ("python", "prose", "repetitive")
uniform, main = last_validation(folder / "reference"), last_validation(folder / "main")
means = [np.mean([run[f"eval/{name}/loss"] for name in learnable]) for run in (uniform, main)]
print(f"mean validation loss over the learnable domains: uniform {means[0]:.4f}, learned {means[1]:.4f}")
if not SMOKE:
    assert means[1] < means[0]

# %% [markdown]
# ## The weights' trajectory
#
# The proxy logs every domain's weight (`doremi/<domain>/weight`) and excess loss
# (`doremi/<domain>/excess_loss`) at every step, with its per-domain training loss (`train/<domain>/loss`) as
# every mixture run does. `halyard plot` draws the weights:

# %%
figure_path = FIGURES / "11_doremi_weights.png"
plot = ["halyard", "plot", "--run", str(folder / "proxy"), "--metric", "doremi/*/weight"]
subprocess.run([*plot, "--out", str(figure_path)], check=True, capture_output=True)

# %% [markdown]
# ![each domain's weight against the proxy's step](figures/11_doremi_weights.png)
#
# In the first steps every domain has an excess loss (the proxy starts from random weights); the repetitive
# domain, which the reference has learned almost perfectly, has the largest and takes nearly all the weight
# until the proxy has learned it too (about 10 steps). Then Python and prose, where the proxy lags behind the
# reference longest, share the weight, trading it back and forth; the noise, once 0 and 1 get half the
# probability each, keeps little more than the smoothing gives it.
#
# ## The main run on the learned mixture
#
# Each learnable domain's validation loss in the reference (the uniform mixture) and the main run (the
# learned mixture), the same model, steps and tokens:

# %%
figure, axes = plt.subplots(figsize=(7, 3.5))
for run, style, label in (("reference", "-", "uniform"), ("main", "--", "learned")):
    rows = [json.loads(line) for line in (folder / run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [row for row in rows if "eval_loss" in row]
    for color, name in zip(("C0", "C1", "C2"), learnable):
        axes.plot(
            [row["step"] for row in evaluated],
            [row[f"eval/{name}/loss"] for row in evaluated],
            style,
            color=color,
            marker="o",
            label=f"{name}, {label} mixture",
        )
axes.set_xlabel("step")
axes.set_ylabel("validation loss (nats per byte)")
axes.legend(fontsize=8)
figure.tight_layout()
figure.savefig(FIGURES / "11_doremi_losses.png", dpi=100)

# %% [markdown]
# ![validation loss per learnable domain, uniform and learned mixture](figures/11_doremi_losses.png)
#
# At step 300 (`doremi-demo`, 2026-12-05): Python 2.420 -> 2.214, prose 2.195 -> 1.763, the repetitive domain
# 0.010 -> 0.039; their mean 1.542 -> 1.339. The learned mixture gives the noise (average weight 0.006) and
# most of the repetitive domain's rows (0.059) to prose (0.530) and Python (0.406); the noise's loss rises a
# little above the entropy of a random bit (0.848 against 0.693 nats). `halyard doremi --config doremi-demo
# --main` took 3.4-4.2 minutes end to end on this 2-core machine, shared with other work.
#
# ## What it costs
#
# The proxy's step runs the reference's forward on the same batch inside the one compiled program (the
# reference's weights frozen, sharded like the proxy's), then the proxy's forward and backward, about one
# forward more than a plain step: a third more arithmetic. Measured on `doremi-demo`'s model and batch (one CPU
# device, the two steps interleaved): the proxy's step takes **1.12-1.16x** a plain step's time
# (`python benchmarks/training/doremi_step.py`; benchmarks/README.md, "DoReMi"). The whole recipe costs two small runs
# (reference and proxy) before the main one: the paper's proxies have 280M parameters for an 8B main model.
#
# ## Your own domains
#
# Any mixture config works: give each source its data and the weights of the reference mixture (the
# reference trains on them; the proxy's weights start uniform):
#
# ```yaml
# data:
#   tokenizer: path/to/tokenizer.json
#   mixture:
#     sources:
#       web: {sources: ["data/web/*.jsonl"]}
#       code: {sources: ["data/code/*.jsonl"], text_field: content}
#       papers: {sources: ["data/papers/*.parquet"]}
#     weights: {web: 1, code: 1, papers: 1}
# ```
#
# ```bash
# halyard doremi --config my-mixture.yaml --trainer.run_dir runs/my-doremi --model.num_layers 4
# halyard doremi --config my-mixture.yaml --reference runs/an-earlier-reference   # reuse a reference run
# train --config runs/my-doremi/main.yaml --model.num_layers 24 --trainer.steps 100000   # the main run
# ```
#
# The proxy is an ordinary run with `trainer.objective: doremi` and `doremi.reference` naming the reference
# run (`doremi.step_size` and `doremi.smoothing` are the paper's 1 and 1e-3): it runs on any mesh and any
# number of processes like every run, and its domain weights live in its checkpoints. It needs
# `trainer.accumulation: 1` (the weights step on the whole batch's losses).
