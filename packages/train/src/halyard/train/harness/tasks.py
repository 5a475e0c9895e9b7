"""Finding lm-eval tasks by name (with close names for a typo) and running them on a model."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from halyard.train.config.errors import ConfigError
from halyard.train.user_errors import one_line

DEFAULT_BOOTSTRAP_ITERS = 100_000
"""lm-eval's default number of bootstrap resamples for the standard errors of non-mean metrics."""


def _known(name: str, names: Sequence[str]) -> bool:
    if any(c in name for c in "*?["):
        return bool(fnmatch.filter(names, name))
    return name in names or Path(name).is_file()


def task_manager(
    tasks: Sequence[str], include_path: str | Path | None = None, *, include_option: str = "--include-path"
) -> Any:
    """An lm-eval ``TaskManager`` that knows every task of ``tasks``.

    Indexing lm-eval's thousands of built-in task files takes seconds, so when every name is defined under
    ``include_path`` only that folder is indexed.

    Args:
        tasks: task, group or tag names, glob patterns, or paths of task YAML files.
        include_path: a folder of task YAML files, searched before lm-eval's own.
        include_option: what the errors call ``include_path`` (the option or config key that sets it).

    Raises:
        ConfigError: no tasks, ``include_path`` is not a folder, or a name no task has (the close names
            are listed).
    """
    from lm_eval.tasks import TaskManager

    if not tasks:
        raise ConfigError("--tasks is empty: name lm-eval tasks, e.g. --tasks hellaswag,arc_easy")
    if include_path is not None:
        if not Path(include_path).is_dir():
            raise ConfigError(f"{include_option} {include_path} is not a folder of task YAML files")
        local = TaskManager(include_path=str(include_path), include_defaults=False)
        if all(_known(name, local.all_tasks) for name in tasks):
            return local
    manager = TaskManager(include_path=None if include_path is None else str(include_path))
    for name in tasks:
        if not _known(name, manager.all_tasks):
            close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
            hint = f"; close names: {', '.join(close)}" if close else ""
            raise ConfigError(
                f"unknown lm-eval task {name!r}{hint} (`lm-eval ls tasks` lists them; {include_option} DIR "
                "adds task YAML files)"
            )
    return manager


def evaluate_tasks(
    lm: Any,
    tasks: Sequence[str],
    *,
    include_path: str | Path | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    log_samples: bool = False,
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS,
    manager: Any | None = None,
) -> dict[str, Any]:
    """Run lm-eval ``tasks`` on ``lm`` and return lm-eval's results dict (``results``, ``n-shot``, ...).

    Args:
        lm: an lm-eval model (a `HalyardLM`, or any other ``lm_eval.api.model.LM``).
        tasks: see `task_manager`.
        include_path: see `task_manager`.
        limit: evaluate the first ``limit`` examples of each task (a fraction when below 1); None: all.
        num_fewshot: few-shot examples per prompt (None: each task's own setting).
        log_samples: keep each example's requests and responses under ``samples``.
        bootstrap_iters: resamples for standard errors (0 skips them).
        manager: a `task_manager` for ``tasks`` built earlier (None: built now; indexing takes seconds).

    Raises:
        ConfigError: see `task_manager`; or a task's data could not be fetched (says how to give it locally).
    """
    import lm_eval

    manager = task_manager(tasks, include_path) if manager is None else manager
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            log_samples=log_samples,
            bootstrap_iters=bootstrap_iters,
        )
    except ConnectionError as error:  # datasets' own, for a hub it cannot reach (or offline mode)
        raise ConfigError(unfetched_data_message(tasks, error)) from error
    assert results is not None  # None only on a non-zero rank, and HalyardLM runs in one process
    return dict(results)


def unfetched_data_message(tasks: Sequence[str], error: ConnectionError) -> str:
    """What to do when the data of one of ``tasks`` could not be downloaded (``error``: what datasets said)."""
    which = f"task {tasks[0]}" if len(tasks) == 1 else f"one of the tasks {', '.join(tasks)}"
    return (
        f"the data of lm-eval {which} could not be fetched: {one_line(str(error))}. Without network, give "
        "lm-eval the data locally: copy a Hugging Face cache that holds it (HF_HOME or HF_DATASETS_CACHE) "
        "from a machine with network and set HF_DATASETS_OFFLINE=1, or write a task YAML of your own whose "
        "dataset_path names local files (--include-path DIR, eval.harness_include_path during training)"
    )
