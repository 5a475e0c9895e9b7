"""A small config tree used by the config tests: a plain section, a `type:` choice section, a scalar."""

from __future__ import annotations

from dataclasses import dataclass, field

import draccus


@dataclass(frozen=True)
class ScheduleSection(draccus.ChoiceRegistry):
    warmup_steps: int = 10
    """Steps of linear warmup."""


@ScheduleSection.register_subclass("cosine")
@dataclass(frozen=True)
class CosineSection(ScheduleSection):
    final_fraction: float = 0.1
    """Learning rate at the end, as a fraction of the peak."""


@ScheduleSection.register_subclass("constant")
@dataclass(frozen=True)
class ConstantSection(ScheduleSection):
    pass


@dataclass(frozen=True)
class LoopSection:
    steps: int = 100
    """Number of optimizer steps."""
    learning_rate: float = 3e-4
    """Peak learning rate."""
    tags: tuple[str, ...] = ()
    """Free-form labels for the run."""


@dataclass(frozen=True)
class ExampleConfig:
    trainer: LoopSection = field(default_factory=LoopSection)
    schedule: ScheduleSection = field(default_factory=lambda: CosineSection(final_fraction=0.2))
    name: str = "example"
    """Run name."""
