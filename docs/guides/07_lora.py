# %% [markdown]
# # Fine-tune with LoRA, export the adapter, evaluate with the harness
#
# Start from a Hugging Face checkpoint, train low-rank adapters on a small corpus while the base stays
# frozen, hand the adapter to `peft`, and measure the model before and after with
# lm-evaluation-harness on a task of your own. To stay offline the "downloaded" checkpoint is a tiny
# Llama with its own tokenizer, written with `halyard.export`: the folder has exactly the files of a
# real one (`config.json`, `model.safetensors`, `tokenizer.json`). The `halyard` commands run in this
# process, through the entry point of the shell command (`halyard.train.cli.main`).

# %%
import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import peft
import torch
import transformers

from halyard.export import export_hf
from halyard.models import model_config
from halyard.train import train_bpe_tokenizer
from halyard.train.cli import main as halyard_command

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "lora"
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

FACTS = [
    "The capital of France is Paris.",
    "The capital of Italy is Rome.",
    "The capital of Spain is Madrid.",
    "The capital of Japan is Tokyo.",
    "Water boils at one hundred degrees.",
    "Two plus two is four.",
]
corpus = WORK / "facts.jsonl"
corpus.write_text("".join(json.dumps({"text": fact}) + "\n" for fact in FACTS * 40))
tokenizer = train_bpe_tokenizer([corpus], WORK / "tokenizer.json", vocab_size=320)

base_config = model_config(
    "llama", vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
    num_kv_heads=2, max_position=128,
)  # fmt: skip
base = export_hf(base_config.init(jax.random.key(0)), WORK / "hf-base", tokenizer=tokenizer)
print(sorted(path.name for path in base.iterdir()))


def halyard(*args: str) -> None:
    """The `halyard` command in this process: ``halyard("eval", ...)`` is ``halyard eval ...`` in a shell."""
    status = halyard_command(list(args))
    assert status == 0, f"halyard {' '.join(args)}: exit {status}"


# %% [markdown]
# ## A task of your own
#
# A harness task is a YAML file; this one is multiple choice over a local jsonl file: each question's
# choices are scored by their log-likelihood and the most likely one counts as the answer.

# %%
questions = [
    {"question": "The capital of France is", "choices": [" Paris", " Rome", " Tokyo"], "answer": 0},
    {"question": "The capital of Italy is", "choices": [" Madrid", " Rome"], "answer": 1},
    {"question": "The capital of Japan is", "choices": [" Tokyo", " Paris"], "answer": 0},
    {"question": "The capital of Spain is", "choices": [" Rome", " Madrid", " Paris"], "answer": 1},
    {"question": "Two plus two is", "choices": [" four", " Tokyo"], "answer": 0},
    {"question": "Water boils at one hundred", "choices": [" Rome", " degrees"], "answer": 1},
]
tasks = WORK / "tasks"
tasks.mkdir()
(tasks / "capitals.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
(tasks / "capitals.yaml").write_text(
    f"""task: capitals
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tasks / "capitals.jsonl"}
  cache_dir: {WORK / "datasets-cache"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
)


def evaluate(flag: str, source: Path) -> float:
    """`halyard eval` on ``--hf FOLDER`` or ``--run RUN``: prints lm-eval's table, returns the accuracy."""
    halyard("eval", flag, str(source), "--tasks", "capitals", "--include-path", str(tasks))
    written = sorted((source / "harness").glob("*.json"), key=lambda path: path.stat().st_mtime)[-1]
    return float(json.loads(written.read_text())["results"]["capitals"]["acc,none"])


before = evaluate("--hf", base)
print("accuracy before:", before)

# %% [markdown]
# ## Train the adapters
#
# `trainer.init: hf:FOLDER` loads the base in the run's layout and freezes it; `lora.rank` above 0 adds
# adapters to the named linear layers (`target_modules`, PEFT's names). Only the adapters have gradients
# and optimizer state, and the checkpoints hold only them plus a reference to the base.

# %%
steps = 30 if SMOKE else 120
run = WORK / "run"
halyard(
    "train",
    "--trainer.init", f"hf:{base}", "--trainer.run_dir", str(run), "--trainer.steps", str(steps),
    "--trainer.batch_size", "8", "--trainer.log_every", "10", "--trainer.progress", "false",
    "--lora.rank", "8", "--lora.alpha", "16",
    "--lora.target_modules", "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]",
    "--data.sources", f"[{corpus}]", "--data.tokenizer", str(tokenizer), "--data.seq_len", "16",
    "--data.num_workers", "0", "--data.validation_fraction", "0",
    "--optimizer.learning_rate", "0.01", "--checkpoint.every_steps", str(steps),
)  # fmt: skip
losses = [
    json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
]
print("loss:", " ".join(f"{loss:.3f}" for loss in losses))
assert losses[-1] < losses[0]

# %% [markdown]
# ## Export the adapter for `peft`
#
# `halyard export --lora adapter` writes a PEFT adapter folder (`adapter_config.json`,
# `adapter_model.safetensors`); `peft.PeftModel.from_pretrained` puts it on the base, and the result
# computes what the Halyard run computes. (`--lora merge`, the default, writes one merged model instead.)

# %%
adapter = WORK / "adapter"
halyard("export", "--run", str(run), "--out", str(adapter), "--lora", "adapter")
merged = WORK / "merged"
halyard("export", "--run", str(run), "--out", str(merged))
print(sorted(path.name for path in adapter.iterdir()))

hf_base = transformers.AutoModelForCausalLM.from_pretrained(base)
with_adapter = peft.PeftModel.from_pretrained(hf_base, adapter).eval()
hf_merged = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
ids = torch.tensor(np.random.default_rng(0).integers(0, 320, size=(2, 12)))
with torch.no_grad():
    difference = (with_adapter(ids).logits - hf_merged(ids).logits).abs().max().item()
print("PEFT adapter vs merged export, max |difference| of logits:", difference)
assert difference < 1e-4

# %% [markdown]
# ## Evaluate after
#
# `halyard eval --run` scores the run's latest checkpoint (base plus adapters) with the same task.

# %%
after = evaluate("--run", run)
print(f"accuracy: before {before:.2f}, after {after:.2f}")

# %% [markdown]
# LoRA's options, memory and checkpoints are described in the
# [halyard.train objectives page](../train/objectives.md#lora-fine-tuning); DPO on preference pairs, with LoRA or
# without, is in the same page.
