"""Optimizers (AdamW, Lion, Sophia-H, Muon) and schedules, built from small optax transformations.

    optimizer = AdamWConfig(learning_rate=3e-4).build(total_steps=1000)   # or adamw(schedule, ...)
    state = optimizer.init(params)
    updates, state = optimizer.update(grads, state, params, loss_fn=lambda p: loss(p, batch))
    params = optax.apply_updates(params, updates)

Parameters may be any pytree, `NamedArray` leaves included. `loss_fn` is only used by Sophia-H.
"""

from halyard.train.optim.config import AdamWConfig, LionConfig, MuonConfig, OptimizerConfig, SophiaHConfig
from halyard.train.optim.multipliers import MultiplierFn, resolve_multipliers, scale_by_multipliers
from halyard.train.optim.muon import matrix_dimension_numbers, muon_labels, scale_by_muon_or_adam
from halyard.train.optim.optimizers import adamw, lion, muon, sophia_h, with_common_steps
from halyard.train.optim.paths import default_weight_decay_mask, map_parameters, path_name
from halyard.train.optim.schedule_config import (
    ConstantScheduleConfig,
    CosineScheduleConfig,
    LinearScheduleConfig,
    ScheduleConfig,
    WSDScheduleConfig,
)
from halyard.train.optim.schedules import warmup_constant_schedule, warmup_decay_schedule
from halyard.train.optim.sophia import hutchinson_diagonal_hessian, scale_by_sophia_h

__all__ = [
    "AdamWConfig",
    "ConstantScheduleConfig",
    "CosineScheduleConfig",
    "LinearScheduleConfig",
    "LionConfig",
    "MultiplierFn",
    "MuonConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "SophiaHConfig",
    "WSDScheduleConfig",
    "adamw",
    "default_weight_decay_mask",
    "hutchinson_diagonal_hessian",
    "lion",
    "map_parameters",
    "matrix_dimension_numbers",
    "muon",
    "muon_labels",
    "path_name",
    "resolve_multipliers",
    "scale_by_multipliers",
    "scale_by_muon_or_adam",
    "scale_by_sophia_h",
    "sophia_h",
    "warmup_constant_schedule",
    "warmup_decay_schedule",
    "with_common_steps",
]
