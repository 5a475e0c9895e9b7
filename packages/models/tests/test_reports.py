"""What the families report to a collecting step (halyard.models.reports) equals the same statistics computed
layer by layer outside the model's scan: activation RMS, attention logit maximum (windows, soft-caps, GQA,
segments), output logits' maximum, and a mixture of experts' router figures."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, decoder_terms, summation_tolerance
from tiny import VOCAB, tiny

import halyard.named as hn
from halyard.models import LmBatch, init_model
from halyard.models.attention import AttentionMask
from halyard.models.layers.moe import RouterStats, load_balancing_loss, router_z_loss
from halyard.models.rotary import apply_rotary
from halyard.named import Axis


def batch_with_two_documents() -> LmBatch:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(2, 13))
    segments = np.zeros((2, 13), np.int32)
    segments[1, 6:] = 1  # the second row holds two documents
    mask = np.ones((2, 13))
    mask[0, 10:] = 0  # and the first row's last tokens are not counted
    return LmBatch.from_tokens(tokens, segments, mask)


def reported(model, batch):
    loss = lambda m, b: m.loss(b, reduction="sum")
    _, reports = jax.jit(hn.collect_reports(loss))(model, batch)
    return {name: np.asarray(value) for name, value in reports.finished().items()}


def reference(model, batch):
    """Per layer (activation RMS, attention logit max) and the logits' max, one layer at a time."""
    model = model.in_compute_dtype()
    config = model.config
    mask = AttentionMask(causal=True, segment_ids=batch.segment_ids)
    x = model.embed(batch.tokens) * config.embedding_scale
    rms, logit_max = [], []
    for index, kind in enumerate(config.layer_kinds()):
        layer = model.layers.layer(index)
        attention = layer.attention
        h = x if layer.attention_norm is None else layer.attention_norm(x)
        query, key = attention.q_proj(h), attention.k_proj(h)
        if attention.q_norm is not None:
            query, key = attention.q_norm(query), attention.k_norm(key)
        if kind.rope is not None:
            query = apply_rotary(query, batch.positions, kind.rope, max_position=attention.max_position)
            key = apply_rotary(key, batch.positions, kind.rope, max_position=attention.max_position)
        q = np.asarray(query.rearrange("batch", "pos", "heads", "head_size").array, np.float64)
        k = np.asarray(key.rearrange("batch", "pos", "kv_heads", "head_size").array, np.float64)
        k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)  # query head h reads kv head h // group
        scale = attention.scale if attention.scale is not None else q.shape[-1] ** -0.5
        logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
        layer_mask = dataclasses.replace(mask, sliding_window=kind.window) if kind.window else mask
        visible = np.asarray(layer_mask.materialize(Axis("pos", 12), Axis("key_pos", 12)).array)
        logit_max.append(np.where(visible[:, None], logits, -np.inf).max())
        x, _ = layer(x, mask, batch.positions, kind=kind)
        rms.append(np.sqrt(np.mean(np.asarray(x.array, np.float64) ** 2)))
    hidden = np.asarray(model.final_norm(x).array, np.float64)
    output = np.einsum("bpe,ve->bpv", hidden, np.asarray(model.unembedding.rearrange("vocab", "embed").array))
    counted = np.asarray(batch.loss_mask.array) > 0
    return np.array(rms), np.array(logit_max), output[counted].max()


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("llama", {}),
        ("mistral", {}),  # a sliding window of 4
        ("gemma2", dict(intermediate_size=48, num_kv_heads=2, head_dim=8, sliding_window=4)),  # soft-caps
    ],
)
def test_layers_report_activation_rms_and_attention_and_output_logit_maxima(family, overrides):
    model = init_model(tiny(family, **overrides), jax.random.key(1))
    batch = batch_with_two_documents()
    values = reported(model, batch)
    rms, logit_max, logits_max = reference(model, batch)
    assert sorted(values) == ["activation/rms/layers", "attention/logit_max/layers", "logits/max"]
    # the reporting program against the layers run one by one: the forward's sums (and an rms's mean over
    # the batch's 2 x 12 x width values)
    terms = decoder_terms(model.model_config, 12)
    width = model.model_config.shape.embed
    np.testing.assert_allclose(
        values["activation/rms/layers"], rms, atol=summation_tolerance(rms, terms + 24 * width), rtol=0
    )
    np.testing.assert_allclose(
        values["attention/logit_max/layers"], logit_max, atol=summation_tolerance(logit_max, terms), rtol=0
    )
    np.testing.assert_allclose(
        values["logits/max"], logits_max, atol=summation_tolerance(logits_max, terms), rtol=0
    )


def test_attention_logit_max_is_computed_a_block_of_queries_at_a_time(monkeypatch):
    import halyard.models.reports as reports

    model = init_model(tiny("llama"), jax.random.key(1))
    batch = batch_with_two_documents()
    whole = reported(model, batch)["attention/logit_max/layers"]
    monkeypatch.setattr(
        reports, "QUERY_BLOCK", 4
    )  # 12 queries: blocks of 4 (and 1 vocabulary entry per block)
    monkeypatch.setattr(reports, "VOCAB_BLOCK", 7)
    # another program (the blocks' shapes): the forward's sums, as the maxima above
    bound = summation_tolerance(whole, decoder_terms(model.model_config, 12))
    np.testing.assert_allclose(
        reported(model, batch)["attention/logit_max/layers"], whole, atol=bound, rtol=0
    )


def test_a_mixture_of_experts_reports_its_router_per_layer():
    model = init_model(tiny("mixtral", num_experts=4, num_experts_per_token=2), jax.random.key(2))
    batch = batch_with_two_documents()
    values = reported(model, batch)
    output = model.in_compute_dtype().decoder(
        batch.tokens,
        mask=AttentionMask(causal=True, segment_ids=batch.segment_ids),
        positions=batch.positions,
        token_mask=batch.loss_mask,
    )
    stats: RouterStats = output.layer_stats
    counted = float(np.asarray(batch.loss_mask.array).sum())
    tokens = values["moe/tokens_per_expert/layers"]
    assert tokens.shape == (2, 4)
    # counts of whole tokens, exact in float32
    np.testing.assert_array_equal(tokens.sum(axis=1), [counted * 2] * 2)  # every counted token: 2 experts
    np.testing.assert_array_equal(tokens, np.asarray(stats.assignments))
    np.testing.assert_array_equal(values["moe/dropped_tokens/layers"], [0.0, 0.0])
    # the router losses of the reporting program against the decoder's: the forward up to a layer's router
    # logits, their softmax (an exp, the experts' sum), the means over the counted tokens, the z-loss's log
    # and square
    terms = decoder_terms(model.model_config, 12) + 4 + int(counted) + 3 * FUNCTION_TERMS
    for index in range(2):
        layer = jax.tree.map(lambda a, i=index: a[i], stats)
        for name, expected in (
            ("moe/load_balancing_loss/layers", load_balancing_loss(layer)),
            ("moe/router_z_loss/layers", router_z_loss(layer)),
        ):
            bound = summation_tolerance(expected, terms)
            np.testing.assert_allclose(values[name][index], expected, atol=bound, rtol=0, err_msg=name)


def test_nothing_is_computed_without_a_collector(monkeypatch):
    import halyard.models.layers.moe as moe
    import halyard.models.reports as reports

    def refuse(*args, **kwargs):
        raise AssertionError("a statistic was computed although nothing collects")

    for module in (reports, moe):
        monkeypatch.setattr(module, "report", refuse)
    model = init_model(tiny("mixtral", num_experts=4, num_experts_per_token=2), jax.random.key(2))
    jax.make_jaxpr(lambda m, b: m.loss(b))(model, batch_with_two_documents())
    with pytest.raises(AssertionError, match="nothing collects"):
        hn.collect_reports(lambda m, b: m.loss(b))(model, batch_with_two_documents())
