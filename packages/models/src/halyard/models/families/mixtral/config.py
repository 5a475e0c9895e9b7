"""The Mixtral config.

h = x + Attention(RMSNorm(x))
y = h + MoE(RMSNorm(h))                      # top_k of num_experts SwiGLU experts per token
loss = CE + router_aux_loss_coef * load_balancing + router_z_loss_coef * router_z

The router losses are means over the batch's real tokens: `CausalLM.loss` passes the loss mask as the
decoder's ``token_mask``, so padding and loss-masked positions do not count in them.
"""

from __future__ import annotations

import dataclasses

from halyard.models.config import register_model
from halyard.models.decoder import BlockLayout
from halyard.models.families.llama import LlamaConfig
from halyard.models.rotary import RotaryConfig


@register_model("mixtral")
@dataclasses.dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    """Mixtral (defaults: Mixtral 8x7B shapes). Every `LlamaConfig` field applies; in addition:

    Attributes:
        num_experts: experts per layer (the ``experts`` axis).
        num_experts_per_token: experts each token is routed to (top-k).
        router_aux_loss_coef: weight of the load-balancing loss added to the training loss.
        router_z_loss_coef: weight of the router z-loss added to the training loss.

    ``remat`` defaults to ``none`` here: ``save_dots`` keeps only ``dot_general`` results, so the experts'
    ``ragged_dot`` products would be recomputed (slower; see benchmarks/README.md).
    """

    intermediate_size: int = 14336
    num_kv_heads: int = 8
    max_position: int = 32768
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=1000000.0))
    num_experts: int = 8
    num_experts_per_token: int = 2
    router_aux_loss_coef: float = 0.02
    router_z_loss_coef: float = 0.001
    remat: str = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mlp_bias:
            raise ValueError("MixtralConfig.mlp_bias is not supported: Mixtral experts have no biases")
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"MixtralConfig.num_experts_per_token={self.num_experts_per_token} must lie between 1 and "
                f"num_experts={self.num_experts}"
            )

    def layout(self) -> BlockLayout:
        return dataclasses.replace(
            super().layout(),
            mlp="moe",
            num_experts=self.num_experts,
            experts_per_token=self.num_experts_per_token,
        )

    def router_loss_weights(self) -> tuple[float, float]:
        return (self.router_aux_loss_coef, self.router_z_loss_coef)
