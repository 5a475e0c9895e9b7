"""The ``rl:`` section: reinforcement learning with verifiable rewards (``trainer.objective: grpo``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from halyard.train.rl.spec import CLIP, IMPORTANCE_CAP, IMPORTANCE_SAMPLING_MODES, LOSSES, RECIPES, LossRecipe


@dataclass(frozen=True)
class RlConfig:
    """Group relative policy optimisation and its variants: for each prompt the engine samples `group_size` completions with the current weights, the rewards score them, each completion's advantage is its reward against its group's, and the policy loss pushes the likely ones up (trainer.objective: grpo, data.format: prompts)."""

    loss: str = "grpo"
    """grpo (each sequence's token mean, then the mean over sequences), dapo (the mean over every token of the batch, with clip-higher and dynamic sampling as DAPO uses them when set), dr_grpo (sums divided by sequences x max_new_tokens; advantages without the group's standard deviation), bnpo (the sum over tokens divided by the batch's token count) or gspo (a sequence-level importance ratio: the geometric mean of the token ratios)."""
    group_size: int = 8
    """Completions sampled per prompt; trainer.batch_size counts completions, so it is a multiple of this."""
    max_new_tokens: int = 256
    """The longest completion; a completion cut there counts as truncated."""
    temperature: float = 1.0
    """The sampling temperature; the trainer's log-probabilities are of the same distribution (logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling (1: off); the trainer's log-probabilities are of the same truncated distribution."""
    clip_low: float = CLIP
    """The ratio is clipped below at 1 - clip_low (PPO's epsilon)."""
    clip_high: float = CLIP
    """The ratio is clipped above at 1 + clip_high (DAPO's clip-higher uses 0.28)."""
    kl_beta: float = 0.0
    """Weight of the k3 KL estimate against the frozen initial weights (0: no reference model is kept)."""
    importance_sampling: str = "none"
    """Correct for the sampler's log-probabilities differing from the trainer's (another program, or stale weights with rl.async_steps): none, token (each token's ratio trainer/sampler, truncated at importance_cap), sequence (one ratio per completion), token_mask or sequence_mask (a weight above importance_cap drops its token or completion from the loss instead)."""
    importance_cap: float = IMPORTANCE_CAP
    """The truncation of the sampler importance weight (TIS; TRL's vllm_importance_sampling_clip_max)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: groups whose rewards are all equal (no advantage) are dropped and more prompts are sampled to fill the batch (at most dynamic_sampling_tries rounds)."""
    dynamic_sampling_tries: int = 4
    """Rounds of extra prompts dynamic sampling draws before it trains on a batch with fewer groups."""
    overlong_buffer: int = 0
    """DAPO's overlong penalty: completions longer than max_new_tokens - overlong_buffer lose up to overlong_penalty of reward, linearly (0: off)."""
    overlong_penalty: float = 1.0
    """The reward lost by a completion of max_new_tokens tokens when overlong_buffer is set."""
    updates_per_batch: int = 1
    """Optimizer steps on each batch of rollouts (PPO epochs); trainer.steps counts optimizer steps."""
    rewards: list[str] = field(default_factory=lambda: ["math"])
    """Reward functions, summed with reward_weights: math (math-verify: boxed answers, fractions, LaTeX), exact (the stripped completion equals the answer), format:REGEX (1 when the completion matches), or module:function (a function of prompt, completion and answer returning a float)."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per reward function (empty: 1 each)."""
    async_steps: int = 0
    """Rollouts for step t + 1 come from the weights of step t + 1 - async_steps (0: the current weights, on-policy; 1: generated with the previous step's weights, corrected by importance sampling)."""
    deterministic: bool = True
    """Run the engine in deterministic mode: a completion's tokens and log-probabilities do not depend on the other rollouts of the batch, so a resumed run samples what the uninterrupted one sampled; and the trainer computes its log-probabilities with the same arithmetic (halyard.named.nn.batch_invariant; `train` starts XLA without fused multiply-adds), so on CPU they equal the sampler's bit for bit."""
    pack: bool = True
    """Train on rows that each hold several sequences (prompt and completion), attention kept within each, instead of one padded row per completion. With rl.deterministic a sequence starts at a multiple of rl.page_size and of the attention kernel's block, so the trainer's log-probabilities stay the sampler's bit for bit."""
    pack_width: int = 1024
    """Tokens per packed row (at least the longest prompt plus rl.max_new_tokens; positions restart in every sequence, so a row may be wider than the model's positions). trainer.accumulation splits a step's rows into microbatches: make each hold as many tokens as the accelerator's memory takes."""
    max_running: int = 64
    """The engine's rows: completions generated at once."""
    page_size: int = 64
    """Tokens per page of the engine's KV cache."""

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"rl.loss={self.loss!r}: use one of {', '.join(LOSSES)}")
        if self.importance_sampling not in IMPORTANCE_SAMPLING_MODES:
            raise ValueError(
                f"rl.importance_sampling={self.importance_sampling!r}: use one of {', '.join(IMPORTANCE_SAMPLING_MODES)}"
            )
        for key in (
            "group_size",
            "max_new_tokens",
            "updates_per_batch",
            "max_running",
            "page_size",
            "dynamic_sampling_tries",
            "pack_width",
        ):
            if getattr(self, key) < 1:
                raise ValueError(f"rl.{key}={getattr(self, key)}: must be at least 1")
        if self.group_size < 2:
            raise ValueError(
                f"rl.group_size={self.group_size}: a group needs at least 2 completions to compare"
            )
        if not self.temperature > 0:
            raise ValueError(f"rl.temperature={self.temperature}: must be positive (the policy must sample)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rl.top_p={self.top_p}: must lie in (0, 1]")
        if self.clip_low < 0 or self.clip_high < 0 or self.kl_beta < 0:
            raise ValueError("rl.clip_low, rl.clip_high and rl.kl_beta must be 0 or more")
        if self.importance_cap < 1:
            raise ValueError(f"rl.importance_cap={self.importance_cap}: must be at least 1")
        if not 0 <= self.overlong_buffer < self.max_new_tokens:
            raise ValueError(f"rl.overlong_buffer={self.overlong_buffer}: must lie in [0, rl.max_new_tokens)")
        if self.async_steps < 0:
            raise ValueError(f"rl.async_steps={self.async_steps}: must be 0 or more")
        if not self.rewards:
            raise ValueError(
                "rl.rewards is empty: name at least one reward function (math, exact, format:REGEX, module:function)"
            )
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ValueError(
                f"rl.reward_weights has {len(self.reward_weights)} weights for {len(self.rewards)} rewards: give one each"
            )

    @property
    def recipe(self) -> LossRecipe:
        """What ``loss`` means: the normaliser, the ratio's level and the rewards' scale
        (`halyard.train.rl.spec.RECIPES`)."""
        return RECIPES[self.loss]

    @property
    def weights(self) -> list[float]:
        """One weight per reward function."""
        return list(self.reward_weights) or [1.0] * len(self.rewards)
