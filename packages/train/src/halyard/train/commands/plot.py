"""``halyard plot``: the loss of runs, overlaid (`halyard.train.plot`), or a metric of one run, a heatmap of
layer against step for a per-layer pattern (`halyard.train.plot_layers`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from halyard.train.config.errors import ConfigError
from halyard.train.plot import PLOT_NAME, plot_runs
from halyard.train.plot_layers import metric_plot_name, plot_metric


def plot_main(argv: Sequence[str]) -> int:
    """``halyard plot --run R [R2 ...] [--out FILE]``: the loss of one or several runs, overlaid; with
    ``--metric PATTERN`` the matching metrics of one run (a heatmap per layer for ``grad_norm/layers/*``)."""
    parser = argparse.ArgumentParser(prog="halyard plot", description=plot_main.__doc__)
    parser.add_argument(
        "--run", nargs="+", action="extend", required=True, help="run folders (trainer.run_dir)"
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"the PNG to write (default: RUN/{PLOT_NAME} for one run, ./{PLOT_NAME} for several; with --metric "
        "RUN/<the metric's name>.png, e.g. RUN/grad_norm_layers.png)",
    )
    parser.add_argument(
        "--metric",
        default=None,
        help="a metric name or glob: one metric is a line, several (grad_norm/layers/*, logged with "
        "trainer.watch) a heatmap of layer against step; default: the loss",
    )
    args = parser.parse_args(argv)
    if args.metric is not None:
        if len(args.run) != 1:
            raise ConfigError(f"--metric plots one run; got {len(args.run)} (--run {' '.join(args.run)})")
        out = args.out or Path(args.run[0]) / metric_plot_name(args.metric)
        print(f"wrote {plot_metric(args.run[0], args.metric, out)}")
        return 0
    out = args.out or (Path(args.run[0]) / PLOT_NAME if len(args.run) == 1 else Path(PLOT_NAME))
    print(f"wrote {plot_runs(args.run, out)}")
    return 0
