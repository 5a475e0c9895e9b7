"""``halyard doremi --config C``: DoReMi end to end. A reference run on the config's mixture (or ``--reference
RUN``), a proxy run learning the sources' weights (``trainer.objective: doremi``), ``domain_weights.json``, and
the ``train`` command of the main run on the learned mixture (``--main`` runs it too)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from halyard.shard import initialize, is_main_process
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import parse_config, save_resolved_config
from halyard.train.doremi.result import learned_weights, main_run_config, write_domain_weights
from halyard.train.mixture.config import source_order
from halyard.train.plot import metrics_file
from halyard.train.run_config import TrainConfig
from halyard.train.step import TrainState
from halyard.train.trackers.jsonl import read_jsonl
from halyard.train.trainer.preflight import finished_step
from halyard.train.trainer.trainer import Trainer


def doremi_main(argv: Sequence[str]) -> int:
    """``halyard doremi --config C [--reference RUN] [--main] [--section.key value ...]``.

    The run folder (``trainer.run_dir``) holds ``reference/`` (unless ``--reference``), ``proxy/``,
    ``domain_weights.json``, ``main.yaml`` and, with ``--main``, ``main/``. Every run resumes where it stopped
    when the command runs again; a finished one is kept.
    """
    parser = argparse.ArgumentParser(prog="halyard doremi", description=doremi_main.__doc__)
    parser.add_argument(
        "--reference", default=None, help="a trained reference run's folder (skips training one)"
    )
    parser.add_argument("--main", action="store_true", help="also train the main run on the learned mixture")
    known, rest = parser.parse_known_args(list(argv))
    config = parse_config(TrainConfig, resolve_config_paths(rest), prog="halyard doremi")
    if not config.data.mixture.sources:
        raise ConfigError(
            "halyard doremi learns the weights of data.mixture's sources: give data.mixture.sources"
        )
    initialize()
    folder = Path(config.trainer.run_dir)
    reference = _reference_config(config, folder)
    reference_dir = known.reference or reference.trainer.run_dir
    if known.reference is None:
        _say(
            f"doremi: the reference run ({reference_dir}), on the mixture {dict(config.data.mixture.weights)}"
        )
        _train(reference)
    proxy = dataclasses.replace(
        reference,
        trainer=dataclasses.replace(reference.trainer, run_dir=str(folder / "proxy"), objective="doremi"),
        doremi=dataclasses.replace(config.doremi, reference=reference_dir),
    )
    _say(f"doremi: the proxy run ({proxy.trainer.run_dir}), Group DRO against {reference_dir}")
    state = _train(proxy)
    weights = learned_weights(state.opt_state, int(state.step), source_order(config.data.mixture))
    main = main_run_config(reference, weights["average"], str(folder / "main"))
    if is_main_process():
        path = write_domain_weights(
            folder, weights, proxy, reference=reference_dir, proxy=proxy.trainer.run_dir
        )
        main_config = save_resolved_config(main, folder, "main.yaml")
        shown = ", ".join(f"{name} {value:.4f}" for name, value in weights["average"].items())
        print(f"doremi: the learned mixture (average over {weights['steps']} steps): {shown}; wrote {path}")
        print(f"doremi: train the main run with\n  train --config {main_config}", flush=True)
    if known.main:
        _train(main)
        _say(_comparison(reference_dir, main.trainer.run_dir, source_order(config.data.mixture)))
    return 0


def _reference_config(config: TrainConfig, folder: Path) -> TrainConfig:
    """The reference run: ``config`` as it is, in ``<run_dir>/reference``, its caches in ``data.cache_dir`` or
    ``<run_dir>/cache`` (shared by the three runs: each source is tokenized once)."""
    cache_dir = config.data.cache_dir or str(folder / "cache")
    return dataclasses.replace(
        config,
        data=dataclasses.replace(config.data, cache_dir=cache_dir),
        trainer=dataclasses.replace(config.trainer, run_dir=str(folder / "reference"), objective="lm"),
    )


def _train(config: TrainConfig) -> TrainState:
    """Train ``config``'s run to ``trainer.steps`` (resuming it), or read the finished run's last state."""
    trainer = Trainer(config)
    if finished_step(config) is not None:
        _say(f"doremi: {config.trainer.run_dir} is finished; kept")
        return trainer.restore_state()
    return trainer.fit().state


def _comparison(reference_dir: str, main_dir: str, names: list[str]) -> str:
    """Each source's last validation loss in the reference run (the initial mixture) and the main run (the
    learned one), at the step both logged last."""
    runs = [_last_eval(run) for run in (reference_dir, main_dir)]
    step = min(run[0] for run in runs)
    lines = [f"doremi: validation loss at step {step}: initial mixture -> learned mixture"]
    for name in names:
        key = f"eval/{name}/loss"
        before, after = (run[1].get(key, math.nan) for run in runs)
        lines.append(f"  {name:>16s}  {before:.4f} -> {after:.4f}")
    return "\n".join(lines)


def _last_eval(run_dir: str) -> tuple[int, dict[str, Any]]:
    rows = [row for row in read_jsonl(metrics_file(run_dir)) if "eval_loss" in row]
    return (rows[-1]["step"], rows[-1]) if rows else (0, {})


def _say(message: str) -> None:
    if is_main_process():
        print(message, flush=True)
