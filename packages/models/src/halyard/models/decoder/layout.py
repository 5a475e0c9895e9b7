"""`BlockLayout`: how a family arranges one decoder layer (norms, attention options, MLP kind, init),
and `LayerKind`: what may differ from layer to layer (attention window, rotary setting)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from halyard.models.rotary import RotaryConfig

NORMS = ("rms", "layer")
MLPS = ("plain", "gated", "moe")
QK_NORMS = (None, "head", "projection")


class LayerKind(NamedTuple):
    """The static settings of one layer.

    Attributes:
        window: attention window (None: every earlier position).
        rope: rotary configuration (None: the model has learned absolute positions).
    """

    window: int | None
    rope: RotaryConfig | None


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """One decoder layer: ``h = x + post_attn(attn(pre_attn(x)))``, ``y = h + post_mlp(mlp(pre_mlp(h)))``.

    A norm that is off is the identity. Llama: pre norms only; Gemma 2/3: all four; OLMo 2: post norms only.

    Attributes:
        norm: ``rms`` (RMSNorm) or ``layer`` (LayerNorm with bias).
        norm_eps: the norms' epsilon.
        norm_offset: RMSNorm multiplies by ``offset + weight`` (Gemma: 1.0, weights initialised at 0).
        norm_gains: learned norm weights (muP's default has none).
        pre_attention_norm, post_attention_norm, pre_mlp_norm, post_mlp_norm: which norms exist.
        qk_norm: RMSNorm of queries and keys before rotary: ``head`` (over each head, Qwen3 / Gemma 3),
            ``projection`` (over all heads at once, OLMo 2) or None.
        qkv_bias, out_bias: biases on the q/k/v projections and on the output projection.
        mlp: ``plain`` (up, act, down), ``gated`` (act(gate) * up, down) or ``moe`` (routed gated experts).
        mlp_bias: biases in the MLP.
        activation: the MLP activation (`halyard.named.nn.ACTIVATIONS`).
        num_experts, experts_per_token: the ``moe`` MLP's experts and top-k.
        attention_scale: logit multiplier, None for ``1/sqrt(head_size)``.
        attention_softcap: ``cap * tanh(logits / cap)`` on attention logits (Gemma 2), or None.
        report_coordinates: layers also return mean |activation| (muP coordinate checks).
        init_std: std of q/k/v, the MLP input projections and the router.
        out_init_std, mlp_out_init_std: std of the attention output and MLP output projections.
        query_init_std: std of the query projection when it differs from ``init_std`` (muP: 0).
    """

    norm: str = "rms"
    norm_eps: float = 1e-6
    norm_offset: float = 0.0
    norm_gains: bool = True
    pre_attention_norm: bool = True
    post_attention_norm: bool = False
    pre_mlp_norm: bool = True
    post_mlp_norm: bool = False
    qk_norm: str | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    mlp: str = "gated"
    mlp_bias: bool = False
    activation: str = "silu"
    num_experts: int = 0
    experts_per_token: int = 0
    attention_scale: float | None = None
    attention_softcap: float | None = None
    report_coordinates: bool = False
    init_std: float = 0.02
    out_init_std: float | None = None
    mlp_out_init_std: float | None = None
    query_init_std: float | None = None

    def __post_init__(self) -> None:
        for field, choices in (("norm", NORMS), ("mlp", MLPS), ("qk_norm", QK_NORMS)):
            if getattr(self, field) not in choices:
                raise ValueError(f"BlockLayout.{field}={getattr(self, field)!r}; choose one of {choices}")

    @property
    def norms_per_layer(self) -> int:
        """How many of the four block norms exist."""
        flags = (self.pre_attention_norm, self.post_attention_norm, self.pre_mlp_norm, self.post_mlp_norm)
        return sum(flags)
