"""Parameter and FLOP counts for MFU.

`flops_per_token` counts the training step (forward + backward = 3 x forward) of one token:

- every matmul with ``n`` weights costs ``2 n`` FLOPs per token in the forward pass (a multiply and an
  add); this includes the output projection to the vocabulary but not the embedding lookup (a gather);
- attention scores and the weighted sum of values cost ``2 * 2 * heads * head_size`` FLOPs per (query,
  key) pair; a causal query at position ``i`` (0-based) sees ``i + 1`` keys (with a sliding window ``w``:
  ``min(i + 1, w)``), so we count the exact mean number of visible keys over the sequence, about
  ``seq_len / 2``: causal attention counts at half, as MaxText and PaLM's MFU do;
- norms, activations, softmax and rotary are elementwise and not counted;
- MoE models count the router and only the ``top_k`` experts each token uses.
"""

from __future__ import annotations

from halyard.models.config import ModelConfig


def mean_visible_keys(seq_len: int, sliding_window: int | None = None) -> float:
    """Mean number of keys a causal query sees over positions ``0 .. seq_len - 1``.

    Args:
        seq_len: sequence length (tokens), at least 1.
        sliding_window: window size or None (full causal).

    Raises:
        ValueError: ``seq_len`` < 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    window = seq_len if sliding_window is None else min(sliding_window, seq_len)
    # positions 0..window-1 see i+1 keys, the rest see exactly `window`.
    total = window * (window + 1) // 2 + (seq_len - window) * window
    return total / seq_len


def decoder_flops_per_token(
    *,
    matmul_params_per_layer: int,
    num_layers: int,
    attention_width: int,
    vocab_size: int,
    hidden_size: int,
    seq_len: int,
    sliding_window: int | None = None,
) -> float:
    """Training FLOPs per token of a decoder-only transformer (rules in the module docstring).

    Args:
        matmul_params_per_layer: weights a token multiplies per layer (q, k, v, o, MLP; MoE: router and
            the active experts only).
        num_layers: depth.
        attention_width: ``num_heads * head_size``.
        vocab_size, hidden_size: sizes of the output projection.
        seq_len: training sequence length.
        sliding_window: attention window or None.
    """
    forward_matmuls = 2 * (num_layers * matmul_params_per_layer + vocab_size * hidden_size)
    forward_attention = num_layers * 2 * 2 * attention_width * mean_visible_keys(seq_len, sliding_window)
    return 3.0 * (forward_matmuls + forward_attention)


def num_params(config: ModelConfig) -> int:
    """Number of parameters of the model ``config`` builds (tied embeddings counted once)."""
    return config.num_params()


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token at ``seq_len`` for ``config`` (see module doc).

    Raises:
        ValueError: ``seq_len`` < 1.
    """
    return config.flops_per_token(seq_len)
