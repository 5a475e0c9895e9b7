"""Supervised fine-tuning through the run config: prompt/completion data, loss on the completions only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from float_tolerance import decoder_terms, summation_tolerance
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from trainer_fixtures import TINY, load_config, write_config

from halyard.models import LlamaConfig, LmBatch
from halyard.models.attention import AttentionMask
from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.run_data import prepare_data
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.trainer.trainer import Trainer

ROWS, SEQ_LEN = 8, 32  # the batches compared, sft_config's seq_len
MODEL = LlamaConfig(**{name: value for name, value in TINY["model"].items() if name != "type"})
# The model's loss (its blocked cross-entropy) against the test's float64 log-softmax of the model's logits: the
# forward pass in another program, the vocabulary's sum and the batch's targets.
LOSS_TERMS = decoder_terms(MODEL, SEQ_LEN) + MODEL.vocab_size + ROWS * SEQ_LEN


def make_tokenizer(path: Path, corpus: list[str]) -> str:
    """A byte-level BPE tokenizer trained on ``corpus`` (no downloads), with an end-of-text token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("sft")
    rng = np.random.default_rng(0)
    records = []
    for _ in range(60):
        a, b = (int(x) for x in rng.integers(0, 50, size=2))
        records.append({"prompt": f"Q: {a} plus {b}?\nA:", "completion": f" {a + b}"})
    source = folder / "train.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in records))
    tokenizer = make_tokenizer(folder / "tokenizer.json", [r["prompt"] + r["completion"] for r in records])
    return source, tokenizer


def sft_config(tmp_path: Path, sft_files: tuple[Path, str], name: str, **trainer: object):
    source, tokenizer = sft_files
    data = {
        "builtin_corpus": None,
        "sources": [str(source)],
        "tokenizer": tokenizer,
        "format": "prompt_completion",
        "seq_len": 32,
    }
    path = write_config(
        tmp_path / f"{name}.yaml",
        tmp_path / name,
        tmp_path / "cache",
        data=data,
        # Learning rate 0: the parameters after the step are the ones the step's loss was computed with.
        optimizer={"learning_rate": 0.0, "schedule": {"type": "cosine", "warmup": 0}},
        trainer={"steps": 1, **trainer},
        checkpoint={"every_steps": None},
    )
    return load_config(path)


def hand_computed_losses(model, batch: dict[str, np.ndarray]) -> tuple[float, float]:
    """(mean cross-entropy over the loss-mask targets, mean over every same-document prediction)."""
    plain = LmBatch.from_tokens(batch["tokens"], batch["segment_ids"])
    mask = AttentionMask(causal=True, segment_ids=plain.segment_ids)
    logits = np.asarray(model(plain.tokens, mask=mask, positions=plain.positions).array, np.float64)
    labels = batch["tokens"][:, 1:]
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    log_probs -= logits.max(-1, keepdims=True)
    cross_entropy = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    same_document = np.asarray(plain.loss_mask.array, np.float64)
    targets = same_document * batch["loss_mask"][:, 1:]
    return (
        float((cross_entropy * targets).sum() / targets.sum()),
        float((cross_entropy * same_document).sum() / same_document.sum()),
    )


def test_config_gives_batches_whose_mask_is_the_completion_tokens(tmp_path: Path, sft_files) -> None:
    config = sft_config(tmp_path, sft_files, "data")
    data = prepare_data(config.data, tmp_path / "data", progress=False)
    assert data.cache.has_loss_mask
    batch = data.train.batch(0, 8)
    assert batch["loss_mask"].shape == batch["tokens"].shape == (8, 33)
    tokenizer = Tokenizer.from_file(sft_files[1])
    eos = tokenizer.token_to_id("<|endoftext|>")
    stream = data.cache.read(0, data.cache.num_tokens)
    mask = data.cache.read_loss_mask(0, data.cache.num_tokens)
    for line, (tokens, targets) in enumerate(_split_examples(stream, mask, eos)):
        record = json.loads(sft_files[0].read_text().splitlines()[line])
        prompt = tokenizer.encode(record["prompt"], add_special_tokens=False).ids
        completion = tokenizer.encode(record["completion"], add_special_tokens=False).ids
        assert tokens == [*prompt, *completion, eos]
        assert targets == [0] * len(prompt) + [1] * (len(completion) + 1)


def _split_examples(stream: np.ndarray, mask: np.ndarray, eos: int):
    start = 0
    for end in np.flatnonzero(stream == eos) + 1:
        yield stream[start:end].tolist(), mask[start:end].tolist()
        start = int(end)


def trailing_non_targets(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Positions outside the mask with no target after them in their document: no target can see them."""
    mask, segments = batch["loss_mask"], batch["segment_ids"]
    free = np.zeros(mask.shape, bool)
    for row in range(mask.shape[0]):
        target_later = False
        for position in range(mask.shape[1] - 1, -1, -1):
            if position + 1 < mask.shape[1] and segments[row, position + 1] != segments[row, position]:
                target_later = False
            free[row, position] = not mask[row, position] and not target_later
            target_later = target_later or bool(mask[row, position])
    return free


def with_free_tokens_changed(batch: dict[str, np.ndarray], vocab_size: int) -> dict[str, np.ndarray]:
    free = trailing_non_targets(batch)
    assert free.sum() > 0, "the batch has no trailing prompt tokens to change"
    tokens = batch["tokens"].copy()
    tokens[free] = (tokens[free] + 7) % vocab_size
    return {**batch, "tokens": tokens}


def test_lm_batch_with_the_loaders_mask_gives_the_masked_mean(tmp_path: Path, sft_files) -> None:
    config = sft_config(tmp_path, sft_files, "lmbatch")
    data = prepare_data(config.data, tmp_path / "lmbatch", progress=False)
    batch = data.train.batch(0, 8)
    model = config.model.init(jax.random.PRNGKey(0))
    masked, unmasked = hand_computed_losses(model, batch)
    assert abs(masked - unmasked) > 1e-3
    lm_batch = LmBatch.from_tokens(batch["tokens"], batch["segment_ids"], batch["loss_mask"])
    loss = float(model.loss(lm_batch)[0])
    assert loss == pytest.approx(masked, rel=0, abs=summation_tolerance(masked, LOSS_TERMS))
    # Tokens outside the mask that no target sees: changing them leaves the loss as it was, bit for bit (the
    # same program; the targets' attention gives them exactly 0 weight, their own losses are masked to 0).
    changed = with_free_tokens_changed(batch, 300)
    changed_batch = LmBatch.from_tokens(changed["tokens"], changed["segment_ids"], changed["loss_mask"])
    assert float(model.loss(changed_batch)[0]) == loss
    # ... while the unmasked loss moves (the same program on both batches: any difference is the tokens')
    assert hand_computed_losses(model, changed)[1] != unmasked


# The train step's loss function (halyard/train/trainer/loss.py, outside this feature's files) must pass
# batch.get("loss_mask") to LmBatch.from_tokens; until it does these fail, and strict xfail turns into a
# failure the day it does, so the marker cannot outlive the gap.


def test_the_trainer_loss_function_counts_only_target_tokens(tmp_path: Path, sft_files) -> None:
    config = sft_config(tmp_path, sft_files, "lossfn")
    data = prepare_data(config.data, tmp_path / "lossfn", progress=False)
    batch = data.train.batch(0, 8)
    model = config.model.init(jax.random.PRNGKey(0))
    masked, _ = hand_computed_losses(model, batch)
    loss_fn = lm_loss_fn()
    loss_sum, stats = loss_fn(model, batch, jax.random.PRNGKey(0))
    assert float(stats["num_tokens"]) == float(
        (batch["loss_mask"][:, 1:] * (batch["segment_ids"][:, 1:] == batch["segment_ids"][:, :-1])).sum()
    )
    bound = summation_tolerance(masked, LOSS_TERMS + 1)  # and the division by the targets
    assert float(loss_sum) / float(stats["num_tokens"]) == pytest.approx(masked, rel=0, abs=bound)
    changed_sum, _ = loss_fn(model, with_free_tokens_changed(batch, 300), jax.random.PRNGKey(0))
    assert float(changed_sum) == float(loss_sum)  # the same program; the changed tokens weigh exactly 0


@pytest.mark.parametrize("accumulation", [1, 2])
def test_first_step_loss_is_the_masked_mean(tmp_path: Path, sft_files, accumulation: int) -> None:
    config = sft_config(tmp_path, sft_files, f"fit{accumulation}", accumulation=accumulation)
    result = Trainer(config).fit()
    data = prepare_data(config.data, tmp_path / f"fit{accumulation}", progress=False)
    masked, unmasked = hand_computed_losses(result.state.params, data.train.batch(0, 8))
    assert abs(masked - unmasked) > 1e-3
    # the step's loss: the microbatches' sums added and divided by the targets
    bound = summation_tolerance(masked, LOSS_TERMS + accumulation + 1)
    assert result.history[0]["loss"] == pytest.approx(masked, rel=0, abs=bound)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--data.format=dialogue", "data.format='dialogue': use one of text, chat, prompt_completion"),
        ("--data.chat_template=jinja", "data.chat_template='jinja': use one of simple, tokenizer"),
    ],
)
def test_bad_sft_settings_name_the_key(tmp_path: Path, sft_files, override: str, message: str) -> None:
    path = write_config(tmp_path / "bad.yaml", tmp_path / "run", tmp_path / "cache")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path, override)
    with pytest.raises(ConfigError, match="data.builtin_corpus is plain text"):
        load_config(path, "--data.format=chat")
