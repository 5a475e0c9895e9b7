"""The GRPO family's settings in one place: every default, every choice, and what each ``rl.loss`` means.

``rl.loss`` names a recipe (`LossRecipe`): how the per-token losses are averaged (the normaliser, TRL's
``loss_type``), whether the importance ratio is per token or per completion (GSPO's), and how the rewards
are scaled into advantages (Dr. GRPO's: not divided by the group's deviation). The ``rl:`` section
(`halyard.train.rl.config.RlConfig`), `halyard.train.rl.losses.policy_loss` and
`halyard.train.rl.importance.sampler_correction` take their defaults from here, and
`resolve` turns a config into the keyword options of `policy_loss` and of the advantages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
"""A normaliser of the summed per-token losses (TRL's ``loss_type``)."""
LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo")
RatioLevel = Literal["token", "sequence"]
"""One importance ratio per token, or per completion (GSPO)."""
RewardScale = Literal["group", "batch", "none"]
"""What a completion's centred reward is divided by: its group's deviation, the batch's, or nothing."""
ImportanceSampling = Literal["none", "token", "sequence", "token_mask", "sequence_mask"]
"""The sampler correction (`halyard.train.rl.importance`)."""
IMPORTANCE_SAMPLING_MODES: tuple[str, ...] = ("none", "token", "sequence", "token_mask", "sequence_mask")

CLIP = 0.2
"""PPO's epsilon, below and above (DAPO's clip-higher raises the upper one to 0.28)."""
IMPORTANCE_CAP = 3.0
"""The largest sampler importance weight kept (TRL's ``vllm_importance_sampling_clip_max``)."""


@dataclass(frozen=True)
class LossRecipe:
    """What one ``rl.loss`` means.

    Attributes:
        normalizer: how the summed per-token losses are averaged (`LossType`).
        level: the importance ratio's level.
        reward_scale: how rewards become advantages.
    """

    normalizer: LossType
    level: RatioLevel = "token"
    reward_scale: RewardScale = "group"


RECIPES: dict[str, LossRecipe] = {
    "grpo": LossRecipe("grpo"),
    "dapo": LossRecipe("dapo"),
    "dr_grpo": LossRecipe("dr_grpo", reward_scale="none"),
    "bnpo": LossRecipe("bnpo"),
    "gspo": LossRecipe("grpo", level="sequence"),
}
"""``rl.loss`` -> its recipe."""
LOSSES: tuple[str, ...] = tuple(RECIPES)
