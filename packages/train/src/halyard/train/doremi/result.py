"""DoReMi's answer: the proxy's average and final domain weights (``domain_weights.json``) and the main run's
config on the learned mixture."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from halyard.train.doremi.state import DomainWeightsState
from halyard.train.mixture.config import source_order

WEIGHTS_FILE = "domain_weights.json"
"""The file `halyard doremi` writes into its run folder."""


def learned_weights(opt_state: DomainWeightsState, step: int, source_names: list[str]) -> dict[str, Any]:
    """``{"average": {source: weight}, "final": {source: weight}, "steps": step}`` of a proxy's state.

    Args:
        opt_state: the proxy run's optimizer state (its weights replicated on every device).
        step: the steps the proxy trained (the weight sum's count).
        source_names: the sources in `source_order`.
    """
    final = _host(opt_state.weights)
    average = _host(opt_state.weight_sum) / max(step, 1)
    return {
        "average": {name: float(value) for name, value in zip(source_names, average, strict=True)},
        "final": {name: float(value) for name, value in zip(source_names, final, strict=True)},
        "steps": step,
    }


def _host(array: Any) -> np.ndarray:
    """A replicated array's value on this process (in a multi-process run no process holds it all)."""
    return np.asarray(array.addressable_data(0) if hasattr(array, "addressable_data") else array)


def write_domain_weights(
    folder: str | os.PathLike[str], weights: dict[str, Any], config: Any, *, reference: str, proxy: str
) -> Path:
    """Write ``<folder>/domain_weights.json``: `learned_weights`, the data each weight belongs to (each source's
    ``data:`` keys as the config gives them), the initial weights, and the reference and proxy runs.

    Args:
        folder: the DoReMi run folder.
        weights: `learned_weights`.
        config: the proxy run's config (`TrainConfig`).
        reference: the reference run's folder; proxy: the proxy run's.
    """
    mixture = config.data.mixture
    record = {
        **weights,
        "initial": {name: 1.0 / len(mixture.sources) for name in source_order(mixture)},
        "reference_weights": dict(mixture.weights),
        "sources": {name: mixture.sources[name] for name in source_order(mixture)},
        "reference": reference,
        "proxy": proxy,
        "step_size": config.doremi.step_size,
        "smoothing": config.doremi.smoothing,
    }
    path = Path(folder) / WEIGHTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record, indent=2) + "\n")
    temporary.replace(path)
    return path


def main_run_config(config: Any, average: dict[str, float], run_dir: str) -> Any:
    """The main run's config: ``config`` (the reference's) with ``data.mixture.weights`` the learned average,
    no weight schedule, and its own run folder.

    Args:
        config: the reference run's config (`TrainConfig`, ``trainer.objective: lm``).
        average: `learned_weights`'s ``average``.
        run_dir: the main run's folder.
    """
    mixture = dataclasses.replace(
        config.data.mixture, weights={name: round(value, 6) for name, value in average.items()}, schedule={}
    )
    return dataclasses.replace(
        config,
        data=dataclasses.replace(config.data, mixture=mixture),
        trainer=dataclasses.replace(config.trainer, run_dir=run_dir, objective="lm"),
    )
