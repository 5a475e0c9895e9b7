"""The loss plot: training (and validation) loss against the step, one run or several overlaid.

``fit`` writes ``<run_dir>/loss.png`` at the end; ``halyard plot --run R [R2 ...]`` draws any runs
(`halyard.train.commands.plot`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import yaml

from halyard.train.config.errors import ConfigError
from halyard.train.trackers.jsonl import read_jsonl

PLOT_NAME = "loss.png"
"""File name of the plot `fit` writes into the run directory."""


def metrics_file(run_dir: str | os.PathLike[str]) -> Path:
    """The JSONL metrics file of a run (its jsonl tracker's `filename`; `metrics.jsonl` by default).

    Raises:
        ConfigError: the folder has no metrics file (not a run, or a run without a jsonl tracker).
    """
    run = Path(run_dir)
    name = "metrics.jsonl"
    config_path = run / "config.yaml"
    if config_path.is_file():
        try:
            trackers = (yaml.safe_load(config_path.read_text()) or {}).get("trackers") or []
        except (yaml.YAMLError, AttributeError):  # not a run config: the default file name
            trackers = []
        names = [
            t.get("filename", name) for t in trackers if isinstance(t, dict) and t.get("type") == "jsonl"
        ]
        name = names[0] if names else name
    path = run / name
    if not path.is_file():
        raise ConfigError(
            f"{path} does not exist: --run must name a training run folder (trainer.run_dir) with a jsonl "
            "tracker (trackers: [{type: jsonl}])"
        )
    return path


def plot_runs(run_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> Path:
    """Draw the training loss (lines) and validation loss (dots) of each run against the step, into ``out``.

    Args:
        run_dirs: run folders (`trainer.run_dir`); each is labelled by its folder name.
        out: the PNG file to write (its folder is created).

    Raises:
        ConfigError: a folder without metrics, or runs that logged no loss yet.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=100)
    drawn = 0
    for run in run_dirs:
        rows = read_jsonl(metrics_file(run))
        label = Path(run).resolve().name
        for metric, style in (("loss", "-"), ("eval_loss", "o--")):
            points = [(row["step"], row[metric]) for row in rows if _finite(row.get(metric))]
            if points:
                steps, values = zip(*points)
                axes.plot(
                    steps, values, style, label=f"{label} {'train' if metric == 'loss' else 'validation'}"
                )
                drawn += 1
    if not drawn:
        plt.close(figure)
        raise ConfigError(f"no loss logged yet in {', '.join(str(r) for r in run_dirs)}: nothing to plot")
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats per token)")
    axes.grid(alpha=0.3)
    axes.legend()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)
    return path


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def write_run_plot(run_dir: str | os.PathLike[str]) -> Path | None:
    """``<run_dir>/loss.png`` from the run's metrics; None (nothing written) for a run without logged loss."""
    try:
        return plot_runs([run_dir], Path(run_dir) / PLOT_NAME)
    except ConfigError:  # no jsonl tracker, or no step logged: there is nothing to draw
        return None
