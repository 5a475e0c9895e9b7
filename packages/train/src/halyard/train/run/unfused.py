"""Whether this process computes without fused multiply-adds, where a setting's bitwise promise needs that."""

from __future__ import annotations

import jax

from halyard.named.nn import unfuse_multiply_add


def fused_multiply_add_note(setting: str, consequence: str) -> str | None:
    """One line when ``setting`` needs CPU programs without fused multiply-adds and this process's have them.

    XLA contracts a multiply and an add into one fused multiply-add where both land in one fused loop, which
    depends on the rest of the program (a 1-device and an 8-device step; the sampler's and the trainer's), and
    reads that setting once, when JAX starts its backend: the `train` command asks in time
    (`halyard.named.nn.unfuse_multiply_add`), a Trainer built in a Python process that already ran JAX cannot.

    Args:
        setting: the config key that needs it (``trainer.invariant``).
        consequence: what the user gets instead (``"... agree to rounding only"``).

    Returns:
        The line to print, or None: no fused multiply-adds in this process, or programs that do not run on CPU.
    """
    if unfuse_multiply_add() or jax.default_backend() != "cpu":
        return None
    return (
        f"{setting}: XLA runs with fused multiply-adds in this process (it started before "
        "halyard.named.nn.unfuse_multiply_add() could ask otherwise, or this is no x86 CPU), so "
        f"{consequence}; the train command asks in time"
    )
