"""A metric of a run against the step: one line, or for a pattern matching a metric per layer
(``grad_norm/layers/*``) a heatmap, one row per layer, one column per logged step.

    halyard plot --run runs/demo --metric 'grad_norm/layers/*'        # runs/demo/grad_norm_layers.png
    halyard plot --run runs/demo --metric 'attention/logit_max/layers/*' --out logits.png
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import os
import re
from pathlib import Path

import numpy as np

from halyard.train.config.errors import ConfigError
from halyard.train.plot import metrics_file
from halyard.train.trackers.jsonl import read_jsonl

LINES_UP_TO = 12
"""Up to this many matching metrics without a layer number are drawn as lines (more, or per layer: a heatmap)."""


def metric_plot_name(pattern: str) -> str:
    """The default file name of a metric's plot: ``grad_norm/layers/*`` -> ``grad_norm_layers.png``."""
    words = [word for word in re.split(r"[^A-Za-z0-9.]+", pattern) if word]
    return "_".join(words or ["metric"]) + ".png"


def _index_key(name: str) -> tuple:
    """Sort ``x/layers/10`` after ``x/layers/9``: numbers compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def plot_metric(run_dir: str | os.PathLike[str], pattern: str, out: str | os.PathLike[str]) -> Path:
    """Draw the metrics of ``run_dir`` whose names match ``pattern`` (a glob) against the step into ``out``.

    One matching metric is a line; a few without a layer number (``doremi/*/weight``) a line each; more, or
    one per layer, a heatmap whose rows are the metrics in number order (layer 0 at the bottom) and whose
    columns are the steps that logged them.

    Raises:
        ConfigError: a folder without metrics, or no metric matching ``pattern`` (the close names are listed).
    """
    matched, steps, values = metric_matrix(run_dir, pattern)
    return _draw(values, matched, steps, pattern, Path(run_dir).resolve().name, Path(out))


def metric_matrix(run_dir: str | os.PathLike[str], pattern: str) -> tuple[list[str], list[int], np.ndarray]:
    """``(names, steps, values)``: the metrics matching ``pattern`` in number order (``layers/2`` before
    ``layers/10``), the steps that logged any of them, and ``values[name, step]`` (NaN where not logged).

    Raises:
        ConfigError: see `plot_metric`.
    """
    rows = read_jsonl(metrics_file(run_dir))
    names = sorted({name for row in rows for name in row if name != "step"}, key=_index_key)
    matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
    if not matched:
        close = difflib.get_close_matches(pattern.replace("*", "0"), names, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        watch = (
            ""
            if any("/layers/" in name for name in names)
            else " (per-layer metrics need trainer.watch.every)"
        )
        raise ConfigError(f"no metric of {metrics_file(run_dir)} matches --metric {pattern!r}{hint}{watch}")
    steps = sorted({row["step"] for row in rows if any(_number(row.get(name)) for name in matched)})
    values = np.full((len(matched), len(steps)), np.nan)
    column = {step: index for index, step in enumerate(steps)}
    for row in rows:
        for index, name in enumerate(matched):
            if _number(row.get(name)) and row["step"] in column:
                values[index, column[row["step"]]] = row[name]
    return matched, steps, values


def _number(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _draw(
    values: np.ndarray, names: list[str], steps: list[int], pattern: str, label: str, out: Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(9, max(3.0, min(12.0, 0.25 * len(names) + 2))), dpi=100)
    if len(names) == 1:
        axes.plot(steps, values[0], "o-" if len(steps) < 30 else "-")
        axes.set_ylabel(names[0])
    elif len(names) <= LINES_UP_TO and not any(part.isdigit() for name in names for part in name.split("/")):
        # A few named series (a DoReMi proxy's doremi/<source>/weight): a line each, read off one axis.
        for name, row in zip(names, values, strict=True):
            axes.plot(steps, row, "-", label=name)
        axes.set_ylabel(pattern)
        axes.legend()
    else:
        edges = _step_edges(steps)
        mesh = axes.pcolormesh(
            edges, np.arange(len(names) + 1) - 0.5, np.ma.masked_invalid(values), shading="flat"
        )
        figure.colorbar(mesh, ax=axes, label=pattern)
        shared = _shared_parts(names)
        labels = [name[len(shared) :] or name for name in names]
        ticks = range(0, len(names), max(1, len(names) // 16))
        axes.set_yticks(list(ticks), [labels[i] for i in ticks])
        axes.set_ylabel(shared.rstrip("/") or "metric")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("step")
    axes.set_title(f"{label}: {pattern}")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, bbox_inches="tight")
    plt.close(figure)
    return out


def _shared_parts(names: list[str]) -> str:
    """The ``/``-separated parts every name starts with, with the trailing ``/`` (``grad_norm/layers/``)."""
    split = [name.split("/") for name in names]
    shared = []
    for parts in zip(*split):
        if len(set(parts)) > 1:
            break
        shared.append(parts[0])
    return "".join(part + "/" for part in shared)


def _step_edges(steps: list[int]) -> np.ndarray:
    """Column edges around each logged step (half-way to its neighbours), so uneven steps keep their place."""
    centres = np.asarray(steps, dtype=float)
    if len(centres) == 1:
        return np.array([centres[0] - 0.5, centres[0] + 0.5])
    middles = (centres[:-1] + centres[1:]) / 2
    return np.concatenate(
        [[centres[0] - (middles[0] - centres[0])], middles, [centres[-1] + (centres[-1] - middles[-1])]]
    )
