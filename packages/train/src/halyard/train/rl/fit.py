"""`fit_rl`: `Trainer.fit` for ``trainer.objective: grpo`` (the same run folder, checkpoints, log, signals)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from halyard.shard import is_main_process, use_layout
from halyard.train.perf.goodput import Goodput
from halyard.train.plot import write_run_plot
from halyard.train.rl.loop import GrpoLoop
from halyard.train.rl.session import start_rl_session
from halyard.train.trainer.interruption import signalled_on_any_process, stop_run
from halyard.train.trainer.run_folder import RunFolder

if TYPE_CHECKING:
    from halyard.train.trainer.trainer import FitResult, Trainer


def fit_rl(trainer: Trainer, preemption: Any, goodput: Goodput, cache_at_start: Any) -> FitResult:
    """Train a GRPO run to ``trainer.steps`` (resuming when a checkpoint exists); see `Trainer.fit`."""
    from halyard.train.trainer.trainer import FitResult

    with RunFolder(trainer.run_dir, writes=is_main_process()) as folder:
        session = start_rl_session(trainer.setup, trainer.run_dir, goodput, trainer.clock)
        session.log.cache_counts_at_start = cache_at_start
        try:
            with use_layout(trainer.layout, trainer.mesh):
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
    summary = session.log.close()
    if trainer.config.trainer.plot and is_main_process():
        write_run_plot(trainer.run_dir)
    log = session.log
    return FitResult(state=state, last_metrics=log.last, history=log.history, sample=None, summary=summary)
