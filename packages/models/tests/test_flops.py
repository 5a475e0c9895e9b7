"""Parameter counts against the built models, FLOPs against a count derived from the parameter tree."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest
from tiny import tiny

from halyard.models import flops_per_token, mean_visible_keys, num_params
from halyard.named import NamedArray

CASES = {
    "gpt2": tiny("gpt2"),
    "llama_untied": tiny("llama"),
    "llama_tied_bias": tiny("llama", tie_embeddings=True, attention_bias=True, mlp_bias=True),
    "qwen2": tiny("qwen2"),
    "mistral": tiny("mistral"),
    "mixtral": tiny("mixtral", num_experts=4, num_experts_per_token=2),
    "mup": tiny("mup", head_dim=8, d_base=16, use_gains=True),
}


def _shapes(config) -> list[tuple[str, dict[str, int]]]:
    """(path, axis sizes) of every parameter, without materialising it."""
    model = eqx.filter_eval_shape(config.init, jax.random.key(0))
    leaves = jax.tree_util.tree_leaves_with_path(model, is_leaf=lambda x: isinstance(x, NamedArray))
    return [(jax.tree_util.keystr(path), leaf.shape) for path, leaf in leaves if isinstance(leaf, NamedArray)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_num_params_counts_the_built_model(case: str) -> None:
    config = CASES[case]
    assert num_params(config) == sum(int(np.prod(list(shape.values()))) for _, shape in _shapes(config))


@pytest.mark.parametrize("case", sorted(CASES))
def test_flops_per_token_equals_a_count_from_the_parameter_tree(case: str) -> None:
    config, seq_len = CASES[case], 24
    matmul = 0.0
    for path, shape in _shapes(config):
        if "embed" not in shape or len([n for n in shape if n != "layers"]) < 2:
            continue  # norms and biases are elementwise (every weight matrix touches the model axis)
        tied = config.family == "gpt2" or getattr(config, "tie_embeddings", False)
        if path == ".position_embedding.weight" or (
            path in (".embed.weight", ".token_embedding.weight") and not tied
        ):
            continue  # an input-only table is a gather, not a matmul
        size = float(np.prod(list(shape.values())))
        if "experts" in shape and "mlp" in shape:
            size *= config.num_experts_per_token / config.num_experts  # a token uses top_k experts
        matmul += size
    width = config.num_heads * config.head_size
    attention = (
        config.num_layers * 4 * width * mean_visible_keys(seq_len, getattr(config, "sliding_window", None))
    )
    expected = 3 * (2 * matmul + attention)
    np.testing.assert_allclose(flops_per_token(config, seq_len), expected, rtol=1e-9)


def test_mean_visible_keys_counts_a_causal_window_mask() -> None:
    for length, window in [(1, None), (7, None), (8, 3), (8, 20), (5, 1)]:
        query, key = np.arange(length)[:, None], np.arange(length)[None, :]
        visible = key <= query
        if window is not None:
            visible &= key > query - window
        assert mean_visible_keys(length, window) == visible.sum() / length
    assert mean_visible_keys(4096) == pytest.approx(4096 / 2, rel=1e-3)  # causal attention counts at half
