"""``eval.harness_tasks`` during training, through the CLI: the run's metrics hold the harness accuracy at
every ``trainer.eval_every`` steps and at the end, equal to ``halyard eval --step N`` on the checkpoint of
that step; the time counts as evaluation; a missing lm-eval, an unknown task or a bad include path is one
line before any cache or run folder is written, and a run without tasks needs no lm-eval."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import lm_eval
import pytest
from harness_fixtures import TASK, write_task
from lm_eval.tasks import TaskManager
from trainer_fixtures import load_config, write_config

from halyard.train.cli import main
from halyard.train.eval_config import EvalConfig
from halyard.train.trainer.harness_eval import harness_metrics
from halyard.train.trainer.trainer import Trainer

LIMIT = 4
ROLLING = "halyard_tiny_rolling"
ACCURACY = f"harness/{TASK}/acc"
BITS_PER_BYTE = f"harness/{ROLLING}/bits_per_byte"  # a continuous figure: any other weights change it


def write_rolling_task(folder: Path, cache: Path) -> None:
    """`ROLLING`: the log-likelihood of each question of `TASK`'s data, as lm-eval's wikitext task scores pages."""
    (folder / f"{ROLLING}.yaml").write_text(
        "\n".join(
            [
                f"task: {ROLLING}",
                "dataset_path: json",
                f"dataset_kwargs: {{data_files: {{test: {folder / 'tiny_choice.jsonl'}}}, cache_dir: {cache}}}",
                "test_split: test",
                "output_type: loglikelihood_rolling",
                'doc_to_text: ""',
                'doc_to_target: "{{question}}"',
                "metric_list: [{metric: word_perplexity}, {metric: byte_perplexity}, {metric: bits_per_byte}]",
                "",
            ]
        )
    )


def _harness(tasks: Path, **changes: object) -> dict[str, object]:
    names = [TASK, ROLLING]
    return {"harness_tasks": names, "harness_include_path": str(tasks), "harness_limit": LIMIT, **changes}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("harness_training")
    tasks = write_task(root / "tasks", root / "datasets")
    write_rolling_task(tasks, root / "datasets")
    config = write_config(
        root / "run.yaml",
        root / "run",
        root / "cache",
        trainer={"steps": 4, "eval_every": 3},  # harness_every defaults to it: steps 3 and 4 (the end)
        checkpoint={"every_steps": 1},
        eval=_harness(tasks),
    )
    assert main(["train", "--config", str(config)]) == 0
    return {"run": root / "run", "tasks": tasks, "config": config, "root": root}


def _logged(run_dir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl's harness records by step."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line for line in lines if any(key.startswith("harness/") for key in line)}


def test_harness_metrics_are_logged_at_the_interval_and_the_end_and_written_per_step(
    run: dict[str, Path],
) -> None:
    logged = _logged(run["run"])
    assert sorted(logged) == [3, 4]
    for step, record in logged.items():
        assert 0.0 <= record[ACCURACY] <= 1.0 and f"harness/{TASK}/acc_stderr" in record
        assert record[BITS_PER_BYTE] > 0 and f"harness/{ROLLING}/word_perplexity" in record
        written = json.loads((run["run"] / "harness" / f"step_{step}.json").read_text())
        assert written["results"][TASK]["acc,none"] == record[ACCURACY]
        assert written["results"][ROLLING]["bits_per_byte,none"] == record[BITS_PER_BYTE]
        assert written["n-samples"][TASK]["effective"] == written["n-samples"][ROLLING]["effective"] == LIMIT
        assert written["config"]["halyard_step"] == step
    assert logged[3][BITS_PER_BYTE] != logged[4][BITS_PER_BYTE]  # each evaluation sees that step's weights
    assert sorted(path.name for path in (run["run"] / "harness").iterdir()) == ["step_3.json", "step_4.json"]
    summary = json.loads((run["run"] / "metrics.summary.json").read_text())
    assert summary["goodput/evaluation_seconds"] > 0  # no validation split: only the harness evaluated


@pytest.mark.parametrize("step", [3, 4])
def test_logged_accuracy_equals_halyard_eval_on_the_checkpoint_of_that_step(
    run: dict[str, Path], step: int, capsys: pytest.CaptureFixture[str]
) -> None:
    output = run["root"] / f"eval_step_{step}.json"
    argv = ["eval", "--run", str(run["run"]), "--step", str(step), "--tasks", f"{TASK},{ROLLING}"]
    argv += ["--include-path", str(run["tasks"]), "--limit", str(LIMIT), "--output", str(output)]
    assert main(argv) == 0
    capsys.readouterr()
    evaluated = json.loads(output.read_text())["results"]
    logged = _logged(run["run"])[step]
    assert logged[ACCURACY] == evaluated[TASK]["acc,none"]
    assert logged[f"harness/{TASK}/acc_stderr"] == evaluated[TASK]["acc_stderr,none"]
    # the same program on the same weights: `halyard eval` loads the step's checkpoint on the run's mesh and
    # layout, with the same rows per forward pass (8, rounded up to the batch axes) and context
    assert logged[BITS_PER_BYTE] == evaluated[ROLLING]["bits_per_byte,none"]


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert raised.value.code == 2 and "Traceback" not in "\n".join(err), err
    return err[-1]


def test_bad_harness_settings_are_one_line_before_anything_is_written(
    run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the include path is indexed (lm-eval's 15,000 built-in tasks take half a minute on two cores).
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(TaskManager, include_defaults=False))
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    cases = [
        (
            _harness(run["tasks"], harness_tasks=["halyard_tiny_choise"]),
            f"eval.harness_tasks: unknown lm-eval task 'halyard_tiny_choise'; close names: {TASK}",
        ),
        (
            _harness(tmp_path / "no-tasks"),
            f"eval.harness_include_path={tmp_path / 'no-tasks'} is not a folder of task YAML files",
        ),
        (_harness(run["tasks"], harness_every=-1), "eval.harness_every=-1: must be >= 0"),
        (_harness(run["tasks"], harness_limit=0), "eval.harness_limit=0"),
    ]
    for section, expected in cases:
        config = write_config(tmp_path / "run.yaml", run_dir, cache, eval=section)
        line = _error_line(capsys, ["train", "--config", str(config)])
        assert line.startswith("error: ") and expected in line, (section, line)
        assert not run_dir.exists() and not cache.exists()

    config = write_config(tmp_path / "run.yaml", run_dir, cache, eval=_harness(run["tasks"]))
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if lm-eval were not installed
    line = _error_line(capsys, ["train", "--config", str(config)])
    assert line == (
        "error: eval.harness_tasks needs lm-evaluation-harness: pip install lm-eval (or set eval.harness_tasks: [])"
    )
    assert not run_dir.exists() and not cache.exists()
    Trainer(load_config(write_config(tmp_path / "plain.yaml", run_dir, cache)))  # no tasks: no lm-eval needed


def test_the_trainer_imports_without_lm_eval() -> None:
    code = (
        "import sys; sys.modules['lm_eval'] = None\n"
        "import halyard.train.cli, halyard.train.trainer.trainer, halyard.train.trainer.harness_eval\n"
        "assert not [name for name in sys.modules if name.startswith('lm_eval') and sys.modules[name]]"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr


def test_metric_names_and_the_interval() -> None:
    results = {
        "results": {
            "a": {"alias": "a", "acc,none": 0.5, "acc_stderr,none": "N/A", "sample_len": 6},
            "b": {"exact_match,strict-match": 0.25, "exact_match,none": 0.75},
        }
    }
    assert harness_metrics(results) == {
        "harness/a/acc": 0.5,
        "harness/b/exact_match/strict-match": 0.25,
        "harness/b/exact_match": 0.75,
    }
    assert EvalConfig().harness_interval(eval_every=500) == 500
    assert EvalConfig(harness_every=0).harness_interval(eval_every=500) == 0
    assert EvalConfig(harness_limit=5.0).limit() == 5 and EvalConfig(harness_limit=0.5).limit() == 0.5
