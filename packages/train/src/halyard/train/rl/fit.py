"""`fit_rl`: what `Trainer.fit` runs for ``trainer.objective: grpo`` (the same run folder, checkpoints, log,
signals; the GRPO loop instead of the lm loop)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from halyard.shard import is_main_process, use_layout
from halyard.train.perf.goodput import Goodput
from halyard.train.rl.loop import GrpoLoop
from halyard.train.rl.session import start_rl_session
from halyard.train.run.setup import RunSetup
from halyard.train.step import TrainState
from halyard.train.trainer.interruption import signalled_on_any_process, stop_run
from halyard.train.trainer.metrics_log import MetricsLog
from halyard.train.trainer.run_folder import RunFolder


def fit_rl(
    setup: RunSetup,
    run_dir: Path,
    clock: Callable[[], float],
    preemption: Any,
    goodput: Goodput,
    cache_at_start: Any,
) -> tuple[TrainState, MetricsLog]:
    """Train a GRPO run to ``trainer.steps`` (resuming when a checkpoint exists); returns the last state and
    the run's log (still open: `Trainer.fit` closes it).

    Raises:
        SystemExit: preemption (143 / 130 after saving).
    """
    with RunFolder(run_dir, writes=is_main_process()) as folder:
        session = start_rl_session(setup, run_dir, goodput, clock)
        session.log.cache_counts_at_start = cache_at_start
        try:
            with use_layout(setup.layout, setup.mesh):
                state = GrpoLoop(session, preemption, folder).run()
            final_step = int(state.step)
            if final_step > 0:
                session.save(final_step, state)
            with session.log.checkpoint_timer():
                session.manager.wait()
            if signalled_on_any_process(preemption):
                session.log.close()
                stop_run(
                    preemption, f"at step {final_step}, the last; checkpoint saved", main=is_main_process()
                )
        finally:
            session.close()
    return state, session.log
