"""``trainer.watch`` and ``trainer.spikes``: what a run measures inside itself, and when a loss is a spike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WatchConfig:
    """Statistics a step computes every `every` steps, beside the loss: per module and per layer norms, what
    the model reports from inside its layers, histograms. Off by default; the other steps run the program of
    a run without it."""

    every: int = 0
    """Every this many steps, the step also logs the statistics below (0: never). The watched step is a second
    compiled program, run at those steps only."""
    norms: bool = True
    """Gradient, parameter and update norms per module (`grad_norm/<module>`) and per layer of the layer stack
    (`grad_norm/layers/<i>`, `grad_norm/<module>/layers/<i>`), and the optimizer state's norms
    (`opt_state_norm/<field>`); the update norm of a module is the norm of its parameters' change."""
    model: bool = True
    """What the model reports from inside the step (halyard.named.report): per layer activation RMS, attention
    logit maximum, mixture-of-experts tokens per expert, dropped tokens and auxiliary losses, and the output
    logits' maximum, as `<name>` or `<name>/layers/<i>`."""
    histograms: bool = False
    """Histograms of each module's parameters and gradients, for the trackers that draw them (tensorboard,
    wandb; metrics.jsonl has none)."""
    histogram_bins: int = 64
    """Bins of each histogram, between the module's smallest and largest value."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"trainer.watch.every={self.every}: use 0 (off) or a number of steps")
        if self.histogram_bins < 1:
            raise ValueError(f"trainer.watch.histogram_bins={self.histogram_bins}: must be at least 1")

    @property
    def enabled(self) -> bool:
        """Whether any step is watched."""
        return self.every > 0 and (self.norms or self.model or self.histograms)

    def watches(self, step: int) -> bool:
        """Whether the step that ends at ``step`` (1-based: the step count after its update) is watched."""
        return self.enabled and step % self.every == 0


@dataclass(frozen=True)
class SpikeConfig:
    """The loss-spike test: a step whose loss is more than `zscore` standard deviations above the mean of the
    recent steps is logged as a spike (a line, <run_dir>/spikes.jsonl, `spike/zscore` in the trackers) with its
    data position and its worst examples' documents; `halyard replay --run R --step N` recomputes it."""

    zscore: float = 6.0
    """Standard deviations above the recent mean that make a spike (0: no test)."""
    window: int = 100
    """Recent steps the mean and standard deviation are taken over (spikes are left out of it)."""
    min_steps: int = 20
    """Steps of this process seen before the test starts (the first steps' losses fall fast)."""
    worst_examples: int = 4
    """Examples named with a spike, worst loss first, each with its documents (0: none; the step then does not
    compute each example's loss)."""

    def __post_init__(self) -> None:
        if self.zscore < 0:
            raise ValueError(f"trainer.spikes.zscore={self.zscore}: use 0 (off) or a positive number")
        if self.window < 2:
            raise ValueError(f"trainer.spikes.window={self.window}: must be at least 2 steps")
        if not 2 <= self.min_steps <= self.window:
            raise ValueError(
                f"trainer.spikes.min_steps={self.min_steps}: must lie between 2 and trainer.spikes.window"
                f" ({self.window})"
            )
        if self.worst_examples < 0:
            raise ValueError(f"trainer.spikes.worst_examples={self.worst_examples}: must be 0 or more")

    @property
    def enabled(self) -> bool:
        """Whether losses are tested for spikes."""
        return self.zscore > 0
