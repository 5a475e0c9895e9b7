"""TRL's GRPO arithmetic on given arrays: a `trl.GRPOTrainer` without a model, sampler or reward model.

TRL 1.16 computes GRPO in two methods of `GRPOTrainer`: `_generate_and_score_completions` (the advantages
from the rewards, the sampler's importance weights from the old and sampler log-probs, the reference
log-probs) and `_compute_loss` (the policy loss and its metrics). Both run here unchanged on a trainer
built without `__init__`: the attributes they read are set from the case's options, and the three methods
that would need a model, a sampler or reward functions (`_generate`, `_get_per_token_logps_and_entropies`,
`_calculate_rewards`) return the case's arrays. Every number compared is then TRL's own arithmetic.
"""

from __future__ import annotations

import types
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from trl import GRPOTrainer


@dataclass
class Options:
    """One case's GRPO settings, under Halyard's names (`halyard.train.rl.losses.policy_loss`)."""

    loss_type: str = "grpo"
    scale: str = "group"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_beta: float = 0.0
    kl_importance_weighted: bool = True
    importance_sampling: str = "none"
    importance_cap: float | None = 3.0
    importance_floor: float | None = None
    level: str = "token"
    ratio_cap: float | None = None
    max_completion_length: int = 16


@dataclass
class Case:
    """Identical inputs for both sides: float32 ``[sequences, tokens]`` log-probs, rewards ``[groups, size]``
    (NaN: not scored, TRL's None)."""

    rewards: np.ndarray
    logps: np.ndarray
    old_logps: np.ndarray | None  # None: on-policy (TRL then uses the current log-probs without gradient)
    sampler_logps: np.ndarray
    reference_logps: np.ndarray
    lengths: np.ndarray  # completion tokens of each row, at least 1

    @property
    def mask(self) -> np.ndarray:
        return (np.arange(self.logps.shape[1])[None, :] < self.lengths[:, None]).astype(np.float32)


_TRL_MODES = {"token": "token_truncate", "sequence": "sequence_truncate"}


def trainer_for(options: Options, case: Case) -> Any:
    """A `GRPOTrainer` holding only what the two methods read, set from ``options``; stubs return ``case``."""
    groups, group_size = case.rewards.shape
    correction = options.importance_sampling != "none"
    trainer = object.__new__(GRPOTrainer)
    reference_model = object()
    trainer.__dict__.update(
        args=types.SimpleNamespace(
            delta=options.ratio_cap,
            use_bias_correction_kl=options.kl_importance_weighted,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            per_device_train_batch_size=groups * group_size,
            gradient_checkpointing_kwargs=None,
        ),
        accelerator=Accelerator(cpu=True),
        model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
        ref_model=reference_model,
        # Two updates per generation is what makes TRL compute the old log-probs (off-policy).
        num_iterations=1 if case.old_logps is None else 2,
        loss_type=options.loss_type,
        scale_rewards=options.scale,
        epsilon_low=options.clip_low,
        epsilon_high=options.clip_high,
        beta=options.kl_beta,
        importance_sampling_level=options.level,
        use_vllm=correction,
        vllm_importance_sampling_correction=correction,
        vllm_importance_sampling_mode=_TRL_MODES.get(
            options.importance_sampling, options.importance_sampling
        ),
        vllm_importance_sampling_clip_max=options.importance_cap,
        vllm_importance_sampling_clip_min=options.importance_floor,
        max_completion_length=options.max_completion_length,
        num_generations=group_size,
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=torch.ones(1),
        reward_func_names=["reward"],
        current_gradient_accumulation_steps=1,
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        _entropy_bonus_enabled=False,
        environment_factories=None,
        environments=None,
        tools=None,
        mask_truncated_completions=False,
        pad_to_multiple_of=None,
        log_multimodal=False,
        _tokenizer=types.SimpleNamespace(pad_token_id=0),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _logs={
            "prompt": [],
            "completion": [],
            "rewards": defaultdict(list),
            "advantages": [],
            "extra": defaultdict(list),
            "images": [],
        },
        _pending_extra_logs={},
        _pending_metrics={},
    )
    old = case.logps if case.old_logps is None else case.old_logps
    rows = [range(int(length)) for length in case.lengths]

    def generate(prompts: list) -> tuple:
        completions = [[7] * len(row) for row in rows]
        sampler = [[float(case.sampler_logps[i, t]) for t in row] for i, row in enumerate(rows)]
        return [[5, 6]] * len(prompts), completions, None, ["text"] * len(prompts), sampler, {}, None, None

    def scoring_logps(model: Any, *args: Any, **kwargs: Any) -> tuple:
        logps = case.reference_logps if model is reference_model else old
        return torch.tensor(logps), None, None

    trainer._generate = generate
    trainer._get_per_token_logps_and_entropies = scoring_logps
    trainer._calculate_rewards = lambda *args: torch.tensor(case.rewards.reshape(-1, 1))
    return trainer


def trl_grpo(options: Options, case: Case, micro_batches: int = 1) -> dict[str, Any]:
    """TRL's advantages, loss, gradient with respect to the log-probs and logged metrics of ``case``.

    With ``micro_batches`` > 1 the generation batch is split into that many equal micro-batches of
    rows, each a `_compute_loss` call of one gradient-accumulation window (TRL's
    ``steps_per_generation`` = ``gradient_accumulation_steps``), and the loss is their sum (the gradients
    add up in the log-probs' ``.grad``); the metrics are then the last micro-batch's.
    """
    trainer = trainer_for(options, case)
    groups, group_size = case.rewards.shape
    sequences = groups * group_size
    inputs = trainer._generate_and_score_completions([{"prompt": "p"}] * sequences)
    logps = torch.tensor(case.logps, requires_grad=True)
    trainer.args.steps_per_generation = trainer.current_gradient_accumulation_steps = micro_batches
    rows_per_micro_batch = sequences // micro_batches
    total = 0.0
    for start in range(0, sequences, rows_per_micro_batch):
        rows = slice(start, start + rows_per_micro_batch)
        part = {
            key: value[rows] if isinstance(value, torch.Tensor) and value.dim() > 0 else value
            for key, value in inputs.items()
        }
        trainer._get_per_token_logps_and_entropies = lambda *args, rows=rows, **kwargs: (
            logps[rows],
            torch.zeros_like(logps[rows]),
            None,
        )
        loss = trainer._compute_loss(trainer.model, part)
        loss.backward()
        total += float(loss.detach())
    assert logps.grad is not None
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return {
        "advantages": inputs["advantages"].numpy(),
        "loss": total,
        "grad": logps.grad.numpy(),
        "metrics": metrics,
    }
