"""``halyard eval``: validation loss of a run's checkpoint, or lm-evaluation-harness tasks with ``--tasks``.

    halyard eval --run runs/demo                                  # loss / perplexity / bits per byte
    halyard eval --run runs/demo --tasks hellaswag,arc_easy --limit 100 --batch-size 16
    halyard eval --hf hf/llama --tasks my_task --include-path my_tasks/

With ``--tasks`` the results table is printed and the results JSON written to
``RUN/harness/step_<N>.json`` (tasks evaluated earlier at that step are kept in it) or
``FOLDER/harness/results.json`` for ``--hf``, or to ``--output``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.run_data import prepare_data
from halyard.train.mixture.config import mixture_sources
from halyard.train.objectives.lm_evaluate import Evaluator
from halyard.train.run.loading import load_run_config, load_run_model


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _limit(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0 (a count, or a fraction below 1), got {text}")
    return int(value) if value >= 1 and value.is_integer() else value


def parser() -> argparse.ArgumentParser:
    """The arguments of ``halyard eval``."""
    parser = argparse.ArgumentParser(
        prog="halyard eval",
        description="Without --tasks: validation loss, perplexity and bits per byte of a run's checkpoint. "
        "With --tasks: lm-evaluation-harness tasks on a run's checkpoint or a Hugging Face folder; prints "
        "the results table and writes the results JSON (RUN/harness/step_<N>.json, FOLDER/harness/"
        "results.json or --output). Needs lm-eval (pip install lm-eval).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="the run folder (trainer.run_dir)")
    source.add_argument("--hf", help="a Hugging Face folder (config.json, safetensors, tokenizer.json)")
    parser.add_argument(
        "--step", type=int, default=None, help="checkpoint step of --run (default: the latest)"
    )
    parser.add_argument(
        "--tasks", help="comma-separated lm-eval task, group or tag names (or task YAML paths)"
    )
    parser.add_argument("--include-path", help="a folder of task YAML files, searched before lm-eval's")
    parser.add_argument("--limit", type=_limit, help="first N examples per task (a fraction when below 1)")
    parser.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: the task's)")
    parser.add_argument("--batch-size", type=_positive_int, default=8, help="requests per forward pass")
    parser.add_argument("--max-length", type=_positive_int, help="context in tokens (default: the model's)")
    parser.add_argument(
        "--bootstrap-iters", type=int, default=100_000, help="resamples for standard errors (0: none)"
    )
    parser.add_argument("--output", help="the results JSON to write (default: see above)")
    return parser


def eval_main(argv: Sequence[str]) -> int:
    """``halyard eval``: see the module docstring."""
    args = parser().parse_args(argv)
    if args.tasks is None:
        harness_only = ("include_path", "limit", "num_fewshot", "max_length", "output")
        given = [f"--{name.replace('_', '-')}" for name in harness_only if getattr(args, name) is not None]
        if args.hf is not None or given:
            raise ConfigError(f"{' '.join(given) or '--hf'} needs --tasks (lm-eval task names)")
        return validation_main(args.run, args.step)
    if args.hf is not None and args.step is not None:
        raise ConfigError(
            "--step selects a checkpoint of --run; a Hugging Face folder has one set of weights"
        )
    return harness_main(args)


def validation_main(run: str, step: int | None) -> int:
    """Print the validation loss, perplexity and bits per byte of ``run``'s checkpoint at ``step`` (None: the
    latest) as one JSON line.

    Raises:
        ConfigError: the run has no validation split, no config.yaml or no such checkpoint.
    """
    config = load_run_config(run)
    sources = mixture_sources(config.data).values() or [config.data]  # a mixture: any source's split
    if max(source.validation_fraction for source in sources) <= 0:
        raise ConfigError("the run has no validation split (data.validation_fraction is 0)")
    loaded = load_run_model(run, step)
    data = prepare_data(config.data, Path(run), progress=False, init=config.trainer.init)
    assert data.validation is not None and loaded.mesh is not None and loaded.layout is not None
    evaluator = Evaluator(data.validation, config, loaded.mesh, loaded.layout, data.tokenizer_path)
    metrics, _ = evaluator.evaluate(loaded.model)
    print(json.dumps({**metrics, "step": loaded.step}))
    return 0


def harness_main(args: argparse.Namespace) -> int:
    """Evaluate ``args.tasks`` on the model ``args`` names, print the table and write the results JSON."""
    try:
        import lm_eval.utils
    except ModuleNotFoundError as error:
        raise ConfigError("halyard eval --tasks needs lm-evaluation-harness: pip install lm-eval") from error
    from halyard.train.harness import HalyardLM, evaluate_tasks, write_results
    from halyard.train.harness.results import default_output

    tasks = [name.strip() for name in args.tasks.split(",") if name.strip()]
    options: dict[str, Any] = {"batch_size": args.batch_size, "max_length": args.max_length}
    if args.run is not None:
        lm = HalyardLM.from_run(args.run, args.step, **options)
    else:
        lm = HalyardLM.from_hf(args.hf, **options)
    results = evaluate_tasks(
        lm,
        tasks,
        include_path=args.include_path,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
        bootstrap_iters=args.bootstrap_iters,
    )
    print(lm_eval.utils.make_table(results))
    if results.get("groups"):
        print(lm_eval.utils.make_table(results, "groups"))
    output = Path(args.output) if args.output else default_output(args.run or args.hf, lm.step)
    print(f"wrote {write_results(results, output)}")
    return 0
