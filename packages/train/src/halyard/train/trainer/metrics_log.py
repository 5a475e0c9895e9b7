"""What the trainer reports: progress bar, trackers, throughput, MFU and the goodput summary."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax

from halyard.shard import is_main_process
from halyard.shard.compilation_cache import cache_counts, cache_directory
from halyard.train.config.flatten import flatten_config
from halyard.train.mixture.config import source_order
from halyard.train.mixture.metrics import host_metrics
from halyard.train.perf.across_processes import from_process_zero, slowest_process
from halyard.train.perf.goodput import Goodput
from halyard.train.perf.mfu import mfu
from halyard.train.perf.peaks import device_peak_flops
from halyard.train.run_config import TrainConfig
from halyard.train.trackers.config import build_trackers
from halyard.train.trainer.insights import Locate, StepInsights
from halyard.train.trainer.progress import StepProgress


class MetricsLog:
    """Fetches step metrics to the host every ``trainer.log_every`` steps and sends them to the trackers.

    Metrics stay on the device between fetches, so logging does not stall the step pipeline. Also keeps
    the goodput accounting (`halyard.train.perf.goodput.Goodput`): time to the first step, time inside steps,
    checkpoints and evaluation, against the wall time since the trainer started.

    Args:
        config: the run config.
        run_dir: where file trackers write.
        mesh: the training mesh (its device count divides the throughput for MFU).
        start_step: the first step of this process (resumed runs start later).
        model_config: the model's config (for FLOPs per token).
        goodput: the run's goodput accounting, started when the trainer started (default: now).
        clock: a monotonic seconds counter (the goodput's own).
        locate: the data position of a batch row (named with a loss spike's worst examples).

    A step's watched statistics, histograms and loss spike (`StepInsights`) are logged at that step, also
    between two ``log_every`` steps.
    """

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        mesh: Any,
        *,
        start_step: int,
        model_config: Any,
        goodput: Goodput | None = None,
        clock: Callable[[], float] = time.monotonic,
        locate: Locate | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.goodput = goodput or Goodput(clock)
        self.main = is_main_process()
        hyperparameters = flatten_config(config)
        self.tracker = (
            # Logged steps are 1-based (the step count after the update): this process logs from
            # start_step + 1 on, and lines from an earlier attempt at those steps are dropped.
            build_trackers(
                config.trackers, run_dir, hyperparameters=hyperparameters, resume_step=start_step + 1
            )
            if self.main
            else None
        )
        self.history: list[dict[str, float]] = []
        self.insights = StepInsights(config, run_dir, start_step=start_step, main=self.main, locate=locate)
        self.last: dict[str, float] = {}
        self.num_devices = int(mesh.devices.size)
        self.flops_per_token = float(model_config.flops_per_token(config.data.seq_len))
        self.source_names = source_order(config.data.mixture)  # a mixture's per-source losses are named so
        # Every process reports the run's figures (global tokens, the slowest process's time, process 0's
        # peak), so all processes print the same tokens/s and MFU.
        peak = device_peak_flops(jax.local_devices()[0], model_config.compute, kept_in=cache_directory())
        self.peak = dataclasses.replace(peak, flops_per_second=from_process_zero(peak.flops_per_second))
        self._window_start: float | None = None
        self._excluded_seconds = 0.0
        self._window_seconds = 0.0
        self._window_tokens = 0
        self._pending: list[tuple[int, Any]] = []
        # Extra host-side figures added to every logged record (the background cache build's progress).
        self.extra_metrics: Callable[[], dict[str, float]] | None = None
        self.cache_counts_at_start = cache_counts()
        """(requests, hits) of the persistent compilation cache before the run (the summary counts the run's)."""
        self._bar: StepProgress | None = None
        if self.main and config.trainer.progress:
            self._bar = StepProgress(config.trainer.steps, start_step)

    def before_step(self) -> None:
        if self._window_start is None:
            self._window_start = self.clock()

    def after_step(self, step: int, metrics: dict[str, Any], *, tokens: int) -> bool:
        """Record a dispatched step; every ``log_every`` steps wait for it and fetch the metrics.

        Steps run asynchronously, so time is measured per window between fetches: the window's wall time,
        less the checkpoint and evaluation time inside it, is step time (data loading included).

        Returns:
            Whether the metrics were fetched (the device caught up) at this step.
        """
        self._pending.append((step, metrics))
        first = self.goodput.first_step_seconds is None
        if not first:  # the first step includes compilation: keep it out of the throughput
            self._window_tokens += tokens
        fetch = first or step % self.config.trainer.log_every == 0 or step == self.config.trainer.steps
        if fetch:
            jax.block_until_ready(metrics)
            now = self.clock()
            start = self._window_start if self._window_start is not None else now
            self._window_seconds = slowest_process(max(now - start - self._excluded_seconds, 0.0))
            self.goodput.add("step", self._window_seconds, num_steps=len(self._pending))
            self._flush()
            self._window_start = now
            self._excluded_seconds = 0.0
        if self._bar is not None and fetch:
            self._bar.completed_through(step)
        elif self._bar is not None:
            self._bar.dispatched(step, metrics)
        return fetch

    def _flush(self) -> None:
        for index, (step, metrics) in enumerate(self._pending):
            fetched = jax.device_get(metrics)
            inside, histograms = self.insights.take(step, fetched)
            host = {**host_metrics(fetched, self.source_names), **inside, "step": step}
            self.history.append(host)
            if self.tracker is not None and histograms:
                self.tracker.log_histograms(histograms, step)
            if self.tracker is not None and inside and index < len(self._pending) - 1:
                # The step's own record: trackers get the watched statistics at the step they belong to.
                self.tracker.log({k: v for k, v in host.items() if k != "step"}, step)
        self._pending = []
        record = dict(self.history[-1])
        if self.extra_metrics is not None:
            record.update(self.extra_metrics())
        if self._window_tokens:
            tokens_per_second = self._window_tokens / max(self._window_seconds, 1e-9)
            record["tokens_per_second"] = tokens_per_second
            record["mfu"] = mfu(
                self.flops_per_token * self._window_tokens,
                self._window_seconds,
                self.num_devices,
                self.peak.flops_per_second,
            )
        self.last = record
        if self.tracker is not None:
            self.tracker.log({k: v for k, v in record.items() if k != "step"}, int(record["step"]))
        if self._bar is not None:
            shown = {"loss": f"{record['loss']:.4f}"}
            if "tokens_per_second" in record:
                shown["tok/s"] = f"{record['tokens_per_second']:,.0f}"
            if record.get("data/build_finished") == 0.0:  # the cache is still being built beside training
                shown["built"] = f"{record['data/build_tokens']:,.0f} tok"
            self._bar.set_postfix(shown)
        self._window_seconds = 0.0
        self._window_tokens = 0

    def record_eval(self, step: int, metrics: dict[str, float], seconds: float) -> None:
        self.goodput.add("evaluation", seconds)
        self._excluded_seconds += seconds
        if self.tracker is not None:
            self.tracker.log(metrics, step)
        self.last.update(metrics)
        if self.main:
            shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
            print(f"step {step}: {shown}", flush=True)

    @contextlib.contextmanager
    def data_wait_timer(self) -> Iterator[None]:
        """Time spent waiting for a batch: goodput's "waiting for data", kept out of the step time."""
        started = self.clock()
        try:
            with self.goodput.data_wait():
                yield
        finally:
            if self._window_start is not None:  # before the first step no step window is open yet
                self._excluded_seconds += self.clock() - started

    @contextlib.contextmanager
    def rollout_timer(self, compile_seconds: Callable[[], float]) -> Iterator[None]:
        """Time GRPO's rollouts, kept out of the step time: goodput's "compilation" for what the engine spent
        compiling inside (``compile_seconds``: its running total, read before and after), "rollout" for the
        rest (sampling, scoring)."""
        started, compiled = self.clock(), compile_seconds()
        try:
            yield
        finally:
            elapsed = self.clock() - started
            compiling = min(max(compile_seconds() - compiled, 0.0), elapsed)
            self.goodput.add("compilation", compiling)
            self.goodput.add("rollout", elapsed - compiling)
            if self._window_start is not None:  # before the first step no step window is open yet
                self._excluded_seconds += elapsed

    @contextlib.contextmanager
    def checkpoint_timer(self) -> Iterator[None]:
        started = self.clock()
        try:
            with self.goodput.checkpoint():
                yield
        finally:
            self._excluded_seconds += self.clock() - started

    def close(self, *, quiet: bool = False) -> dict[str, float]:
        """Finish the trackers; return (and print and log, unless ``quiet``: no step ran) the goodput summary."""
        summary = {k: float(v) for k, v in self.goodput.summary().items()}
        summary["peak_flops_per_device"] = self.peak.flops_per_second
        requests, hits = (now - before for now, before in zip(cache_counts(), self.cache_counts_at_start))
        summary["compilation_cache/programs_loaded"] = hits
        summary["compilation_cache/programs_compiled"] = requests - hits
        if self._bar is not None:
            self._bar.close()
        if self.tracker is not None:
            if not quiet:
                self.tracker.log_summary(summary)
            self.tracker.finish()
        if self.main and not quiet:
            print(self.goodput.summary_text(), flush=True)
            print(f"MFU is measured against {self.peak.describe()}", flush=True)
            directory = cache_directory()
            if directory:
                print(
                    f"compilation cache: {hits} of {requests} programs loaded from {directory} "
                    "(trainer.compilation_cache)",
                    flush=True,
                )
        return summary
