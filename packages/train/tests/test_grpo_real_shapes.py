"""rl.deterministic on the shapes users start from, through `train --config qwen2.5-0.5b-grpo-gsm8k
--trainer.init hf:FOLDER` as a new user runs it: chat prompts of mixed lengths (a shared system message, user
messages of 3 to 40 words), a random-weight checkpoint with SmolLM2's structure (30 layers, 9 heads of 64,
GQA 3, tied embeddings), Qwen2's query, key and value biases and Llama 3's rope scaling, its norm scales and
biases drawn away from 1 and 0 (a fresh model's are exactly 1 and 0, which hides any difference in where
they are applied). The sampler's log-probs are the trainer's bit for bit in float32 and bfloat16 compute, and
the time before the first step is accounted under its names (no rollout is "waiting for data").

On a random-weight run of the real dimensions (hidden 576, MLP 1,536, vocabulary 49,152, 30 layers; measured
on CPU) the difference is 0 too; the test keeps the structure with the smallest widths. Its float32 run is
also the test of a tied unembedding materialised before the logits' product (`CausalLM.logits`): without
that optimization barrier it logs a nonzero difference, as the SmolLM2-shaped run (49,152 tokens) that
test_grpo_trainer.py had for it did."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from trainer_fixtures import run_cli

from halyard.export import export_hf
from halyard.models import init_model, model_config
from halyard.models.rotary.config import RotaryConfig

WORDS = ["<unk>", "system", "user", "assistant", "you", "are", "a", "helpful", "the", "of", "to", "and", "in",
         "is", "it", "that", "was", "for", "on", "with", "as", "at", "one", "have", "this", "from", "paris"]  # fmt: skip
SPECIALS = ["<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (  # ChatML, SmolLM2's and Qwen2's
    "{% for message in messages %}<|im_start|>{{ message['role'] }} {{ message['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)


def _tokenizer(folder: Path) -> Path:
    folder.mkdir()
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"eos_token": "<|im_end|>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**settings, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    return folder


def _prompts(path: Path) -> Path:
    rng = random.Random(0)
    system = {"role": "system", "content": "you are a helpful assistant"}
    with path.open("w") as file:
        for _ in range(16):
            words = " ".join(rng.choice(WORDS[4:]) for _ in range(rng.randint(3, 40)))
            record = {"prompt": [system, {"role": "user", "content": words}], "answer": "paris"}
            file.write(json.dumps(record) + "\n")
    return path


def _checkpoint(folder: Path, tokenizer: Path) -> Path:
    """Qwen2 (biases on the queries, keys and values) with SmolLM2's heads and layers and Llama 3.2's rope."""
    rope = RotaryConfig(theta=500000.0, scaling="llama3", factor=32.0, original_max_position=8192)
    config = model_config(
        "qwen2", vocab_size=len(WORDS) + len(SPECIALS), hidden_size=64, intermediate_size=32, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, tie_embeddings=True, max_position=131072, rope=rope,
    )  # fmt: skip
    model = init_model(config, jax.random.key(0))
    rng = np.random.default_rng(1)

    def drawn(leaf: object) -> object:  # norm scales around 1, biases around 0, as a trained model's
        if not isinstance(leaf, jax.Array) or not jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf
        values = np.asarray(leaf)
        if np.all(values == 1) or np.all(values == 0):
            return jnp.asarray(values + 0.1 * rng.standard_normal(values.shape), leaf.dtype)
        return leaf

    leaves, tree = jax.tree.flatten(model)
    export_hf(jax.tree.unflatten(tree, [drawn(leaf) for leaf in leaves]), folder, tokenizer=tokenizer)
    return folder


@pytest.fixture(scope="module")
def checkpoint_and_prompts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The checkpoint and the prompts, written once: both compute dtypes start from the same files."""
    folder = tmp_path_factory.mktemp("real_shapes")
    return _checkpoint(folder / "hf", _tokenizer(folder / "tokenizer")), _prompts(folder / "prompts.jsonl")


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "float32"])
def test_the_sampler_agrees_with_the_trainer_bitwise_from_a_real_shaped_checkpoint(
    tmp_path: Path, compute_dtype: str, checkpoint_and_prompts: tuple[Path, Path]
) -> None:
    checkpoint, prompts = checkpoint_and_prompts
    run_dir = tmp_path / "run"
    args = [
        "--config", "qwen2.5-0.5b-grpo-gsm8k", "--trainer.init", f"hf:{checkpoint}",
        "--data.sources", f"[{prompts}]", "--rl.rewards", "[format:paris]",
        "--model.compute_dtype", compute_dtype, "--trainer.run_dir", str(run_dir), "--trainer.steps", "2",
        "--trainer.batch_size", "16", "--rl.group_size", "4", "--rl.max_running", "16", "--rl.max_new_tokens", "6",
        "--trainer.eval_every", "0", "--checkpoint.every_steps", "100", "--trackers", "[{type: jsonl}]",
    ]  # fmt: skip
    # Optimised programs, as users run them: the 30 layers' rollouts at -O0 (bfloat16's most) cost more than
    # the longer compile saves.
    result = run_cli(args, devices=1, timeout=900, optimized=True)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 2 and all(r["sampling/sampling_logp_difference/max"] == 0.0 for r in steps)
    assert min(r["completion/length_mean"] for r in steps) > 1  # completions were sampled, not ended at once
    summary = json.loads((run_dir / "metrics.summary.json").read_text())
    assert summary["goodput/data_wait_seconds"] == 0.0  # the prompts are in memory: nothing waits for data
    assert (
        summary["goodput/compilation_seconds"] > 0.0
    )  # the engine compiled its programs at the first rollout
    assert summary["goodput/rollout_seconds"] > 0.0
    assert "compiling engine" in result.stdout
