"""Packed GRPO rows (`halyard.train.rl.packing`): where each sequence lands, that a packed sequence's
log-probs are its padded row's bit for bit with the training arithmetic (page-aligned, as rl.deterministic
packs) and do not depend on its row's other sequences, and that the loss and its gradients are the padded
batch's (to rounding) when sequences pack at any token; and `train` packing a run's rows."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trainer_fixtures import run_cli

from halyard.models import init_model, model_config
from halyard.train.rl.config import RlConfig
from halyard.train.rl.objective import completion_logprobs, grpo_loss_fn, policy_logprobs
from halyard.train.rl.packing import PackedSequence, RowLayout, layout_rows

LENGTHS = [(5, 9), (12, 30), (3, 1), (20, 44), (7, 16), (9, 2), (4, 40), (6, 5)]
"""(prompt, completion) tokens of the eight sequences."""
COMPLETION = 48


def _sequences(seed: int = 0) -> list[PackedSequence]:
    rng = np.random.default_rng(seed)
    return [
        PackedSequence(
            list(rng.integers(1, 64, p)),
            list(rng.integers(1, 64, c)),
            list(-rng.random(c).astype(np.float32)),
        )
        for p, c in LENGTHS
    ]


ADVANTAGES = np.linspace(-0.5, 1.0, len(LENGTHS)).astype(np.float32)


def _layout(packed: bool, align: int = 64, microbatches: int = 1) -> RowLayout:
    width = 256 + 1 if packed else 64 + 1
    return RowLayout(width, longest=64, completion_tokens=COMPLETION, packed=packed, align=align,
                     microbatches=microbatches, gain=1.0)  # fmt: skip


@pytest.fixture(scope="module")
def model() -> object:
    config = model_config(
        "llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
        num_kv_heads=2, max_position=64,
    )  # fmt: skip
    return init_model(config, jax.random.key(0))


@pytest.mark.parametrize("microbatches", [1, 2])
def test_each_sequence_lies_whole_in_one_row_of_its_microbatch_at_an_aligned_start(microbatches: int) -> None:
    sequences = _sequences()
    arrays = layout_rows(sequences, ADVANTAGES, _layout(True, align=16, microbatches=microbatches))
    tokens, segments, positions = arrays["tokens"], arrays["segment_ids"], arrays["positions"]
    width = tokens.shape[1]
    assert tokens.shape[0] % microbatches == 0 and tokens.shape[0] < len(sequences)
    for s, sequence in enumerate(sequences):
        size = len(sequence.completion)
        flat = arrays["label_index"][s, :size]
        local_row, label = flat // (width - 1), flat % (width - 1)
        row = local_row[0] * microbatches + s % microbatches  # the step takes rows m, m + M, ... (strided)
        assert np.all(local_row == local_row[0])
        start = label[0] + 1 - len(sequence.prompt)
        assert start % 16 == 0
        np.testing.assert_array_equal(
            tokens[row, start : start + sequence.length], sequence.prompt + sequence.completion
        )
        np.testing.assert_array_equal(
            tokens[row, label + 1], sequence.completion
        )  # each label predicts its token
        np.testing.assert_array_equal(
            positions[row, start : start + sequence.length], np.arange(sequence.length)
        )
        ids = segments[row, start : start + sequence.length]
        assert len(set(ids)) == 1 and ids[0] > 0 and np.sum(segments[row] == ids[0]) == sequence.length
        np.testing.assert_array_equal(arrays["sampler_logps"][s, :size], sequence.sampler_logps)
        assert arrays["completion_mask"][s].sum() == size


def test_the_padded_layout_is_one_sequence_per_row_with_the_models_positions() -> None:
    """Row s is sequence s, its labels counted within the row (any equal cut of the batch keeps them)."""
    arrays = layout_rows(_sequences(), ADVANTAGES, _layout(False, microbatches=2))
    assert arrays["tokens"].shape == (len(LENGTHS), 65) and "segment_ids" not in arrays
    for s, sequence in enumerate(_sequences()):
        tokens = arrays["tokens"][s]
        np.testing.assert_array_equal(tokens[: sequence.length], sequence.prompt + sequence.completion)
        labels = arrays["label_index"][s, : len(sequence.completion)]
        np.testing.assert_array_equal(tokens[labels + 1], sequence.completion)


def test_packing_that_saves_too_little_trains_padded_rows() -> None:
    """Sequences that each fill a page: aligned packing would hold as many tokens as the padded rows."""
    rng = np.random.default_rng(0)
    full = [
        PackedSequence(list(rng.integers(1, 64, 8)), list(rng.integers(1, 64, 56)), [0.0] * 56)
        for _ in range(8)
    ]
    layout = RowLayout(257, longest=64, completion_tokens=COMPLETION + 8, align=64)
    arrays = layout_rows(full, ADVANTAGES, layout)
    assert "segment_ids" not in arrays and arrays["tokens"].shape == (8, 65)


def _logps(model: object, arrays: dict[str, np.ndarray], invariant: bool) -> np.ndarray:
    rows = {
        k: jnp.asarray(v)
        for k, v in arrays.items()
        if k in ("tokens", "segment_ids", "positions", "label_index")
    }
    run = jax.jit(lambda m, r: completion_logprobs(m, r, temperature=0.7, top_p=1.0, invariant=invariant)[0])
    return np.asarray(run(model, rows))


def test_page_aligned_packed_log_probs_are_the_padded_rows_bit_for_bit(model: object) -> None:
    """The training arithmetic (rl.deterministic's) gives a packed sequence its padded row's log-probs, the
    promise the sampler's log-probs rest on."""
    sequences = _sequences()
    padded = _logps(model, layout_rows(sequences, ADVANTAGES, _layout(False)), invariant=True)
    packed_arrays = layout_rows(sequences, ADVANTAGES, _layout(True))
    assert packed_arrays["tokens"].shape[0] < len(sequences)  # several sequences share rows
    packed = _logps(model, packed_arrays, invariant=True)
    mask = packed_arrays["completion_mask"] > 0
    np.testing.assert_array_equal(packed[mask], padded[mask])


def test_the_old_and_reference_log_probs_of_packed_microbatches_are_the_padded_rows(model: object) -> None:
    """One program for both, a microbatch at a time as the step cuts them (trainer.accumulation 2): each
    sequence's log-probs are its padded row's bit for bit."""
    sequences = _sequences()
    arrays = layout_rows(sequences, ADVANTAGES, _layout(True, microbatches=2))
    rows = {
        k: jnp.asarray(v)
        for k, v in arrays.items()
        if k in ("tokens", "segment_ids", "positions", "label_index")
    }
    config = RlConfig(max_new_tokens=COMPLETION, temperature=0.7)
    old, reference = jax.jit(policy_logprobs(config, microbatches=2))((model, model), rows)
    padded = _logps(model, layout_rows(sequences, ADVANTAGES, _layout(False)), invariant=True)
    mask = arrays["completion_mask"] > 0
    np.testing.assert_array_equal(np.asarray(old)[mask], padded[mask])
    np.testing.assert_array_equal(np.asarray(reference)[mask], padded[mask])


def test_a_packed_sequence_does_not_see_its_neighbours(model: object) -> None:
    """Other tokens in the row's other sequences leave a sequence's log-probs as they were, bit for bit."""
    first = _sequences(0)
    other = _sequences(1)
    changed = [first[0], *other[1:]]  # sequence 0 kept, every neighbour replaced
    before = _logps(model, layout_rows(first, ADVANTAGES, _layout(True, align=1)), invariant=False)
    after = _logps(model, layout_rows(changed, ADVANTAGES, _layout(True, align=1)), invariant=False)
    size = len(first[0].completion)
    np.testing.assert_array_equal(before[0, :size], after[0, :size])


def test_the_loss_and_gradients_of_packed_rows_are_the_padded_rows(model: object) -> None:
    """Packed at any token (without rl.deterministic): the same loss and gradients to float32 rounding."""
    loss_fn = grpo_loss_fn(RlConfig(max_new_tokens=COMPLETION, temperature=0.7, deterministic=False))

    def value_and_grad(arrays: dict[str, np.ndarray]) -> tuple[jax.Array, object]:
        batch = {k: jnp.asarray(v) for k, v in arrays.items()}
        return jax.jit(jax.value_and_grad(lambda m: loss_fn(m, batch, jax.random.key(0))[0]))(model)

    sequences = _sequences()
    loss_padded, grads_padded = value_and_grad(layout_rows(sequences, ADVANTAGES, _layout(False)))
    loss_packed, grads_packed = value_and_grad(layout_rows(sequences, ADVANTAGES, _layout(True, align=1)))
    assert float(loss_padded) != 0.0
    np.testing.assert_allclose(float(loss_packed), float(loss_padded), rtol=1e-5)
    for packed, padded in zip(jax.tree.leaves(grads_packed), jax.tree.leaves(grads_padded), strict=True):
        np.testing.assert_allclose(np.asarray(packed), np.asarray(padded), rtol=1e-4, atol=1e-6)


def test_train_packs_the_demos_long_completions_and_keeps_the_samplers_bits(tmp_path: Path) -> None:
    """``train --config grpo-demo`` with room for 60-token completions (most end sooner), two microbatches,
    two updates per rollout batch and a KL term: the rows are packed (fewer than the completions), the old
    policy's and the reference's log-probs come from one program on them, and the sampler's log-probs are
    the trainer's bit for bit."""
    run_dir = tmp_path / "run"
    args = [
        "--config", "grpo-demo", "--trainer.run_dir", str(run_dir), "--trainer.steps", "2",
        "--trainer.batch_size", "16", "--rl.max_running", "16", "--model.max_position", "128",
        "--rl.max_new_tokens", "60", "--rl.pack_width", "256", "--trainer.accumulation", "2", "--rl.updates_per_batch", "2",
        "--rl.kl_beta", "0.01", "--trainer.log_every", "1", "--trainer.eval_every", "0",
        "--checkpoint.every_steps", "100",
    ]  # fmt: skip
    result = run_cli(args, devices=1)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "loss" in r]
    assert len(steps) == 2
    assert steps[0]["train/rows"] < 16 and steps[0]["train/row_width"] == 257  # the rollouts' step
    for record in steps:
        # the old policy's log-probs (a program of their own) against the sampler's, bit for bit
        assert record["sampling/sampling_logp_difference/max"] == 0.0
        assert np.isfinite(record["loss"]) and np.isfinite(record["kl"])
