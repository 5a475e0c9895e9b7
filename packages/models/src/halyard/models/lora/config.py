"""`LoraConfig`: which linear layers get low-rank adapters, of what rank and scale.

The targets are named as Hugging Face and PEFT name them (``q_proj``, ``gate_proj``...); `TARGET_MODULES`
says where each one lives in Halyard's decoder block.
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_MODULES: dict[str, str] = {
    "q_proj": "attention.q_proj",
    "k_proj": "attention.k_proj",
    "v_proj": "attention.v_proj",
    "o_proj": "attention.o_proj",
    "gate_proj": "mlp.gate",
    "up_proj": "mlp.up",
    "down_proj": "mlp.down",
}
"""PEFT / Hugging Face module name -> the `Linear` of Halyard's `DecoderBlock` it names."""


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021): frozen base weights plus a trained ``x A B * alpha / rank`` on each targeted linear layer of every block."""

    rank: int = 0
    """Rank of each adapter (the lora_rank axis of A and B); 0 turns LoRA off and the whole model trains."""
    alpha: float = 8.0
    """Scale of the adapters' output: each adds (x A B) * alpha / rank (PEFT's lora_alpha, default 8 as there)."""
    dropout: float = 0.0
    """Dropout on each adapter's input while training (PEFT's lora_dropout), its masks drawn from the step's key (deterministic); 0 disables it. Evaluation never drops."""
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    """The linear layers of every block that get an adapter, by their Hugging Face / PEFT names: q_proj, k_proj, v_proj, o_proj (attention), gate_proj, up_proj, down_proj (MLP). A family may lack some (GPT-2 has no gate_proj, Mixtral's experts are not linear layers)."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"lora.rank={self.rank}: must be 0 (off) or a positive rank such as 8")
        if not self.alpha > 0:
            raise ValueError(
                f"lora.alpha={self.alpha}: must be positive (the adapters' scale is alpha / rank)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout={self.dropout}: must be in [0, 1)")
        unknown = [name for name in self.target_modules if name not in TARGET_MODULES]
        if unknown:
            raise ValueError(
                f"lora.target_modules: unknown {', '.join(map(repr, unknown))}; use some of "
                f"{', '.join(TARGET_MODULES)}"
            )
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"lora.target_modules={list(self.target_modules)} names a module twice")
        if self.rank and not self.target_modules:
            raise ValueError("lora.target_modules is empty: name the layers to adapt, e.g. [q_proj, v_proj]")

    @property
    def enabled(self) -> bool:
        """Whether any adapter is added (``rank > 0``)."""
        return self.rank > 0

    @property
    def scale(self) -> float:
        """``alpha / rank``, the multiplier on the adapters' output."""
        return self.alpha / self.rank
