"""Checks every decoder family passes, shared by the ``test_family_*.py`` files.

- `assert_logits_match`: logits against a transformers model on a batch with rows of different lengths
  (full, right-padded, left-padded), compared at the real positions only;
- `assert_generation_matches_forward`: greedy decoding through the KV cache (`generate`, prompts of
  different lengths) equals the full forward of prompt + generated tokens;
- `assert_training_steps_agree`: a grad step scanned with remat, unrolled without, and in the FSDP and
  tensor-parallel layouts on 8 simulated devices.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch
from float_tolerance import (
    assert_loss_and_grads_close,
    decoder_terms,
    referee_terms,
    summation_tolerance,
    training_terms,
)
from paged import paged_greedy

from halyard.models import LmBatch, ModelConfig, init_model
from halyard.models.attention import AttentionMask
from halyard.named import named
from halyard.shard import Layout, MeshSpec, init_sharded, use_layout


def padded_batch(vocab: int, length: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, attention_mask)`` ``[3, length]``: a full row, a right-padded and a left-padded one."""
    ids = np.random.default_rng(seed).integers(0, vocab, size=(3, length)).astype(np.int64)
    attention_mask = np.ones((3, length), np.int64)
    attention_mask[1, length - 4 :] = 0
    attention_mask[2, :3] = 0
    return ids, attention_mask


def halyard_logits(model: Any, ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """``model``'s float32 logits ``[batch, pos, vocab]``; padded keys are masked, positions count from 0."""
    tokens = named(jnp.asarray(ids, jnp.int32), ("batch", "pos"))
    mask = AttentionMask(
        causal=True, key_valid=named(jnp.asarray(attention_mask, bool), ("batch", "key_pos"))
    )
    return np.asarray(
        jax.jit(lambda m, t, k: m(t, mask=k))(model, tokens, mask).unwrap("batch", "pos", "vocab")
    )


def assert_logits_match(model: Any, hf_model: Any, vocab: int) -> np.ndarray:
    """Assert ``model`` and the transformers ``hf_model`` agree at every real position of `padded_batch`, to
    what two implementations' float32 sums can make differ (`referee_logits_tolerance`).

    Returns:
        The transformers logits (for further comparisons).
    """
    ids, attention_mask = padded_batch(vocab)
    with torch.no_grad():
        expected = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention_mask)).logits
    expected = expected.numpy()
    valid = attention_mask.astype(bool)
    assert np.abs(expected[valid]).max() > 0.05, "logits too small for a meaningful comparison"
    bound = referee_logits_tolerance(model, expected[valid], ids.shape[1])
    np.testing.assert_allclose(
        halyard_logits(model, ids, attention_mask)[valid], expected[valid], atol=bound, rtol=0
    )
    return expected


def referee_logits_tolerance(model: Any, logits: np.ndarray, length: int) -> float:
    """How far Halyard's float32 logits of ``model`` and transformers' (``logits``) may differ over rows of
    ``length`` positions: each implementation's forward pass, rotary angles and activations in its own order
    (`float_tolerance.referee_terms`), at the logits' size (1e-4 + 1e-4 |x| was a number one CPU meets)."""
    return summation_tolerance(logits, referee_terms(model.model_config, length))


def assert_generation_matches_forward(model: Any, *, new_tokens: int = 5) -> None:
    """Greedy decoding through the inference engine's path (`CausalLM.paged_step`: the prompt, then one
    token a step against the pages) of prompts of different lengths gives the logits of the full forward
    over each prompt + its generated tokens, to the summation order of the forward pass (the cached steps
    add the same terms in other orders: `summation_tolerance` of `decoder_terms`)."""
    prompts = [[5, 9, 2, 7, 1, 3, 8], [3], [8, 8, 4]]
    longest = max(map(len, prompts))
    # every step one program: the longest prompt's step (and a padding token), a pool of its pages
    shape = dict(step_tokens=longest + 1, pool_pages=-(-(longest + new_tokens) // 4))
    generated = [paged_greedy(model, prompt, new_tokens, page_size=4, **shape) for prompt in prompts]
    sequences = [prompt + tokens for prompt, (tokens, _) in zip(prompts, generated)]
    # right padding changes no earlier position (causal), so one forward serves every sequence
    padded = np.zeros((len(prompts), max(map(len, sequences))), np.int32)
    for row, sequence in enumerate(sequences):
        padded[row, : len(sequence)] = sequence
    full = np.asarray(model(named(jnp.asarray(padded), ("batch", "pos"))).unwrap("batch", "pos", "vocab"))
    terms = decoder_terms(model.model_config, padded.shape[1])
    for row, (prompt, (tokens, logits)) in enumerate(zip(prompts, generated)):
        expected = full[row, len(prompt) - 1 : len(prompt) - 1 + new_tokens]
        np.testing.assert_allclose(logits, expected, atol=summation_tolerance(expected, terms), rtol=0)
        assert tokens == np.argmax(expected, axis=-1).tolist()


def training_batch(vocab: int, *, rows: int = 8, length: int = 9) -> LmBatch:
    """A batch of random windows (two documents per row, so segments matter)."""
    windows = np.random.default_rng(1).integers(0, vocab, size=(rows, length))
    segments = np.where(np.arange(length) < length // 2, 1, 2)[None].repeat(rows, 0)
    return LmBatch.from_tokens(windows, segments)


@eqx.filter_jit
def _value_and_grad(model: Any, batch: LmBatch) -> Any:
    return eqx.filter_value_and_grad(lambda m: m.loss(batch)[0])(model)


def loss_and_grads(model: Any, batch: LmBatch) -> tuple[float, list[np.ndarray]]:
    """The training loss of ``batch`` and every gradient leaf (one grad step's inputs)."""
    loss, grads = _value_and_grad(model, batch)
    return float(loss), [np.asarray(g) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))]


def sharded_loss_and_grads(
    config: ModelConfig, layout_name: str, batch: LmBatch, **mesh_sizes: int
) -> tuple[float, list[np.ndarray]]:
    """`loss_and_grads` of the model created directly in a layout preset over 8 simulated devices.

    Raises:
        AssertionError: fewer than 8 devices (run with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``)
            or a layout that leaves every parameter on one device.
    """
    assert jax.device_count() >= 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    layout = Layout.preset(layout_name, min_shard=0, tolerance=1.0)
    mesh = MeshSpec(**mesh_sizes).build()
    model = init_sharded(config.init, layout, mesh, jax.random.key(0))
    assert any(len(leaf.sharding.device_set) > 1 for leaf in jax.tree.leaves(model)), "nothing was sharded"
    with use_layout(layout, mesh):
        return loss_and_grads(model, batch)


def single_device_loss_and_grads(config: ModelConfig, batch: LmBatch) -> tuple[float, list[np.ndarray]]:
    """`loss_and_grads` of ``config.init(key(0))`` on one device (the reference for the layouts)."""
    return loss_and_grads(init_model(config, jax.random.key(0)), batch)


def assert_same_loss_and_grads(
    got: tuple[float, list[np.ndarray]],
    want: tuple[float, list[np.ndarray]],
    config: ModelConfig,
    batch: LmBatch,
) -> None:
    """Equal losses and gradients of a step of ``config`` on ``batch``, to the order of the step's sums
    (another layout or execution mode adds the same terms in another order: `training_terms`)."""
    rows, length = batch.tokens.axis_size("batch"), batch.tokens.axis_size("pos")
    assert_loss_and_grads_close(got, want, training_terms(config, rows, length))


def randomize_norms(hf_model: Any, spread: float = 0.3) -> Any:
    """``hf_model`` with every norm weight drawn around 1 (transformers initialises them all at 1, which
    would hide a norm read into the wrong place); returns the model."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                parameter.copy_(1 + spread * torch.randn(parameter.shape, generator=generator))
    return hf_model


LAYOUTS = (("fsdp", dict(fsdp=8, data=1)), ("tensor_parallel", dict(tensor=2, data=4)))
"""The layouts `assert_training_steps_agree` runs, with their meshes."""


def assert_training_steps_agree(config: ModelConfig, batch: LmBatch) -> None:
    """One grad step (`CausalLM.loss`) of ``config``, scanned with ``save_dots`` remat, equals the unrolled
    step without remat and the steps of the model created in each of `LAYOUTS`."""
    assert (config.scan_layers, config.remat) == (True, "save_dots"), "give the scanned save_dots config"
    reference = single_device_loss_and_grads(config, batch)
    unrolled = config.replace(scan_layers=False, remat="none")
    assert_same_loss_and_grads(single_device_loss_and_grads(unrolled, batch), reference, config, batch)
    for layout, mesh in LAYOUTS:
        got = sharded_loss_and_grads(config, layout, batch, **mesh)
        assert_same_loss_and_grads(got, reference, config, batch)
