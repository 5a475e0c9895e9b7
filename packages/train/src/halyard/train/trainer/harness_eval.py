"""lm-evaluation-harness tasks during training (``eval.harness_tasks``): on the weights in memory, at every
``eval.harness_every`` steps and at the end.

lm-eval is imported only when tasks are set, so a run without them needs no lm-eval installed.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from halyard.models import CausalLM
from halyard.shard import Layout, is_main_process, process_count
from halyard.train.config.errors import ConfigError
from halyard.train.eval_config import EvalConfig
from halyard.train.run_config import TrainConfig
from halyard.train.user_errors import one_line

if TYPE_CHECKING:
    from halyard.train.harness import HalyardLM

INCLUDE_KEY = "eval.harness_include_path"


def check_harness(config: TrainConfig) -> None:
    """Check that the run can evaluate ``eval.harness_tasks`` (nothing to check without tasks): lm-eval is
    installed, the run has one process, the include path is a folder, and every task name is known.

    Raises:
        ConfigError: naming the key and the fix (an unknown task with the close names).
    """
    section = config.eval
    if not section.harness_tasks:
        return
    try:
        import lm_eval  # noqa: F401  (the harness package imports it; checked first for the message)
    except ModuleNotFoundError as error:
        raise ConfigError(
            "eval.harness_tasks needs lm-evaluation-harness: pip install lm-eval (or set eval.harness_tasks: [])"
        ) from error
    if process_count() > 1:
        raise ConfigError(
            f"eval.harness_tasks runs in one process, this run has {process_count()}: set eval.harness_tasks: "
            "[] and evaluate its checkpoints on one host with halyard eval --run RUN --step N --tasks ..."
        )
    include = section.harness_include_path
    if include is not None and not Path(include).is_dir():
        raise ConfigError(f"{INCLUDE_KEY}={include} is not a folder of task YAML files")
    try:
        _task_manager(tuple(section.harness_tasks), include)
    except ConfigError as error:
        raise ConfigError(f"eval.harness_tasks: {error}") from error


@functools.lru_cache(maxsize=4)
def _task_manager(tasks: tuple[str, ...], include_path: str | None) -> Any:
    """lm-eval's index of the tasks, built once per run (indexing its built-in tasks takes seconds)."""
    from halyard.train.harness.tasks import task_manager

    return task_manager(tasks, include_path, include_option=INCLUDE_KEY)


class PeriodicHarness:
    """Runs the run's harness tasks on the weights it is given, with one `HalyardLM` for the whole run (so
    the model compiles once per length bucket, not once per evaluation).

    Args:
        section: the run's ``eval`` section (tasks, limit, include path, few-shot).
        every: steps between evaluations (0: only when asked at the end).
        run_dir: the run folder: process 0 writes ``harness/step_<N>.json`` in it.
        lm: the `HalyardLM` whose weights each evaluation replaces.
    """

    def __init__(self, section: EvalConfig, every: int, run_dir: Path, lm: HalyardLM) -> None:
        self.section = section
        self.every = every
        self.run_dir = run_dir
        self.lm = lm
        self.last_step: int | None = None

    def due(self, step: int) -> bool:
        """Whether the interval asks for an evaluation after ``step`` steps."""
        return bool(self.every) and step % self.every == 0

    def evaluate(self, model: CausalLM, step: int) -> tuple[dict[str, float], float]:
        """``({harness/<task>/<metric>: value}, seconds taken)`` for ``model`` after ``step`` steps; process 0
        writes lm-eval's results to ``run_dir/harness/step_<step>.json`` as ``halyard eval`` does."""
        from halyard.train.harness import evaluate_tasks, write_results
        from halyard.train.harness.results import default_output

        started = time.monotonic()
        self.lm.set_model(model, step=step)
        section = self.section
        results = evaluate_tasks(
            self.lm,
            section.harness_tasks,
            include_path=section.harness_include_path,
            limit=section.limit(),
            num_fewshot=section.harness_num_fewshot,
            manager=_task_manager(tuple(section.harness_tasks), section.harness_include_path),
        )
        if is_main_process():
            write_results(results, default_output(self.run_dir, step))
        self.last_step = step
        return harness_metrics(results), time.monotonic() - started


def harness_metrics(results: dict[str, Any]) -> dict[str, float]:
    """The metrics of lm-eval's ``results["results"]`` (its ``<metric>,<filter>`` keys holding numbers) as
    ``harness/<task>/<metric>``: ``acc,none`` is ``acc``, a metric under another filter ``<metric>/<filter>``
    (``exact_match/strict-match``)."""
    metrics = {}
    for task, values in results.get("results", {}).items():
        for key, value in values.items():
            metric, comma, filter_name = key.partition(",")
            if not comma or isinstance(value, bool) or not isinstance(value, int | float):
                continue  # the alias and sample_len, and "N/A" standard errors
            name = metric if filter_name == "none" else f"{metric}/{filter_name}"
            metrics[f"harness/{task}/{name}"] = float(value)
    return metrics


def periodic_harness(
    config: TrainConfig,
    run_dir: Path,
    tokenizer_path: str,
    model: CausalLM,
    mesh: jax.sharding.Mesh,
    layout: Layout,
) -> PeriodicHarness | None:
    """The run's `PeriodicHarness`, or None without ``eval.harness_tasks``.

    Args:
        config: the run config (its ``eval`` section, and ``trainer.eval_every`` for the default interval).
        run_dir: the run folder.
        tokenizer_path: the run's tokenizer.
        model: the weights now (their structure and placement are every later evaluation's).
        mesh, layout: the run's; requests are split over the mesh's batch axes as training batches are.

    Raises:
        ConfigError: `HalyardLM` refuses the model or tokenizer (e.g. no EOS token).
    """
    if not config.eval.harness_tasks:
        return None
    from halyard.train.harness import HalyardLM
    from halyard.train.harness.batching import batch_shards, round_up

    # `halyard eval`'s 8 requests per forward pass, or one per device when the batch axes hold more.
    batch_size = round_up(8, batch_shards(mesh, layout))
    try:
        lm = HalyardLM(
            model, tokenizer_path, batch_size=batch_size, mesh=mesh, layout=layout, source=str(run_dir)
        )
    except ValueError as error:
        raise ConfigError(f"eval.harness_tasks: {one_line(str(error))}") from error
    return PeriodicHarness(config.eval, config.eval.harness_interval(config.trainer.eval_every), run_dir, lm)
