"""Model FLOPs utilisation: the share of the devices' peak that the model's arithmetic achieves."""

from __future__ import annotations


def mfu(flops_per_step: float, step_seconds: float, num_devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation of a training step, in [0, 1] for a correct peak.

    Args:
        flops_per_step: model FLOPs of one optimizer step over the global batch (forward + backward,
            not counting rematerialisation), e.g. `tokens_per_step * transformer_train_flops_per_token(...)`.
        step_seconds: wall time of one step.
        num_devices: devices the step ran on.
        peak_flops_per_device: peak FLOP/s of one device (`device_peak_flops(...).flops_per_second`).

    Raises:
        ValueError: a non-positive time, device count or peak, or negative FLOPs.
    """
    if step_seconds <= 0 or num_devices < 1 or peak_flops_per_device <= 0 or flops_per_step < 0:
        raise ValueError(
            "mfu needs flops_per_step >= 0, step_seconds > 0, num_devices >= 1 and a positive peak; got "
            f"{flops_per_step=}, {step_seconds=}, {num_devices=}, {peak_flops_per_device=}."
        )
    return flops_per_step / (step_seconds * num_devices * peak_flops_per_device)


def transformer_train_flops_per_token(
    num_params: int, num_layers: int, hidden_size: int, seq_len: int, causal: bool = False
) -> float:
    """Training FLOPs per token of a decoder-only transformer: `6 N + 12 L H S` (PaLM, appendix B).

    `6 N` covers the weight matmuls (forward 2N, backward 4N) and `12 L H S` the attention scores and
    weighted sums over `S` positions. Like PaLM (and most published MFU numbers) the full attention
    matrix is counted by default; `causal=True` counts only its unmasked half.

    Args:
        num_params: parameters taking part in matmuls (embeddings excluded unless tied to the output).
        num_layers: transformer blocks.
        hidden_size: model width (heads x head size).
        seq_len: tokens per sequence.
        causal: count only the unmasked (lower-triangular) half of the attention matrix.
    """
    attention = 12.0 * num_layers * hidden_size * seq_len
    return 6.0 * num_params + (attention / 2 if causal else attention)
