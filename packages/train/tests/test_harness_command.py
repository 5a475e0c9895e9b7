"""``halyard eval --tasks`` on a run trained 2 steps: the table, the results JSON in the run folder, the same
accuracy as lm-eval's HFLM on the run's export; and every anticipated mistake as one line with exit code 2."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import lm_eval
import pytest
import torch
from harness_fixtures import TASK, write_task
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from trainer_fixtures import load_config, write_config

from halyard.train.cli import main
from halyard.train.harness import HalyardLM, write_results
from halyard.train.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("harness_run")
    run_dir = root / "run"
    config = write_config(root / "run.yaml", run_dir, root / "cache", trainer={"steps": 2})
    Trainer(load_config(config)).fit()
    return {"run": run_dir, "tasks": write_task(root / "tasks", root / "datasets"), "root": root}


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert raised.value.code == 2, err
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def test_eval_tasks_on_a_run_prints_the_table_and_writes_json_matching_hflm_on_its_export(
    run: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", "--run", str(run["run"]), "--tasks", TASK, "--include-path", str(run["tasks"])]
    assert main([*argv, "--limit", "5", "--batch-size", "4", "--bootstrap-iters", "0"]) == 0
    out = capsys.readouterr().out
    assert TASK in out and "acc" in out and "|" in out  # lm-eval's markdown table
    written = run["run"] / "harness" / "step_2.json"
    assert f"wrote {written}" in out
    results = json.loads(written.read_text())
    assert results["n-samples"][TASK]["effective"] == 5
    assert results["config"]["halyard_step"] == 2

    torch.set_num_threads(1)
    assert main(["export", "--run", str(run["run"]), "--out", str(run["root"] / "hf")]) == 0
    reference = lm_eval.simple_evaluate(
        model=HFLM(pretrained=str(run["root"] / "hf"), device="cpu", dtype="float32", batch_size=4),
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(run["tasks"]), include_defaults=False),
        limit=5,
        bootstrap_iters=0,
    )
    assert reference is not None
    assert results["results"][TASK]["acc,none"] == reference["results"][TASK]["acc,none"]


def test_results_of_other_tasks_at_the_same_step_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "harness" / "step_2.json"
    write_results({"results": {"a": {"acc,none": 0.5}}, "versions": {"a": 1}, "samples": {"a": []}}, path)
    write_results({"results": {"b": {"acc,none": 0.25}}, "versions": {"b": 2}}, path)
    written = json.loads(path.read_text())
    assert written["results"] == {"a": {"acc,none": 0.5}, "b": {"acc,none": 0.25}}
    assert written["versions"] == {"a": 1, "b": 2} and "samples" not in written


def test_help_names_the_harness_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["eval", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    for option in ("--tasks", "--include-path", "--limit", "--batch-size", "--hf", "--run", "--step"):
        assert option in out


def test_bad_input_is_one_line(
    run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = ["--tasks", TASK, "--include-path", str(run["tasks"])]
    no_checkpoint = tmp_path / "fresh"
    no_checkpoint.mkdir()
    shutil.copy(run["run"] / "config.yaml", no_checkpoint / "config.yaml")
    cases: list[tuple[list[str], str]] = [
        (["--run", str(no_checkpoint), *tasks], f"{no_checkpoint} has no complete checkpoint"),
        (["--run", str(tmp_path / "nothing"), *tasks], "config.yaml does not exist"),
        (["--run", str(run["run"]), "--step", "7", *tasks], "--step 7: "),
        (["--hf", str(run["run"]), "--step", "2", *tasks], "--step selects a checkpoint of --run"),
        (
            ["--run", str(run["run"]), "--tasks", TASK, "--include-path", str(tmp_path / "no")],
            "is not a folder",
        ),
        (["--run", str(run["run"]), "--limit", "3"], "--limit needs --tasks"),
        (["--hf", str(tmp_path)], "--hf needs --tasks"),
        (["--hf", str(tmp_path / "no-model"), "--tasks", TASK], "no-model"),
        (["--run", str(run["run"]), "--tasks", " , "], "--tasks is empty"),
    ]
    for argv, expected in cases:
        line = _error_line(capsys, ["eval", *argv])
        assert line.startswith("error: ") and expected in line, (argv, line)
    line = _error_line(capsys, ["eval", "--run", str(run["run"]), "--step", "7", *tasks])
    assert line == f"error: --step 7: no checkpoint at step 7 in {run['run']}; available: 2"

    monkeypatch.setitem(sys.modules, "lm_eval.utils", None)  # as if lm-eval were not installed
    line = _error_line(capsys, ["eval", "--run", str(run["run"]), *tasks])
    assert "pip install lm-eval" in line


def test_an_unknown_task_lists_close_names(
    run: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A name outside the include path makes lm-eval index its 15,000 built-in tasks too (half a minute on
    # CI's two cores); here only the include path is indexed, which is what the close names come from.
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(TaskManager, include_defaults=False))
    argv = [
        "eval",
        "--run",
        str(run["run"]),
        "--tasks",
        "halyard_tiny_choise",
        "--include-path",
        str(run["tasks"]),
    ]
    line = _error_line(capsys, argv)
    assert "unknown lm-eval task 'halyard_tiny_choise'" in line and f"close names: {TASK}" in line


def test_model_args_name_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one of run=RUN_DIR, hf=FOLDER"):
        HalyardLM.create_from_arg_string("batch_size=2")
    with pytest.raises(ValueError, match="key=value pairs"):
        HalyardLM.create_from_arg_string("run")
    with pytest.raises(ValueError, match="batch_size='auto': give a whole number"):
        HalyardLM.create_from_arg_string("run=runs/x", {"batch_size": "auto"})


def test_a_task_whose_data_cannot_be_fetched_says_how_to_give_it_locally(
    run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task reading its data from the Hugging Face Hub (as hellaswag does), with no hub to reach: offline
    # mode fails at once where an unreachable network fails after a minute of retries.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    folder = tmp_path / "tasks"
    folder.mkdir()
    task = (run["tasks"] / f"{TASK}.yaml").read_text().replace(f"task: {TASK}", "task: hub_choice")
    task = (
        task.split("dataset_path:")[0]
        + "dataset_path: Rowan/hellaswag\ntest_split: test\n"
        + (task.split("test_split: test\n")[1])
    )
    (folder / "hub_choice.yaml").write_text(task)
    argv = ["eval", "--run", str(run["run"]), "--tasks", "hub_choice", "--include-path", str(folder)]
    line = _error_line(capsys, [*argv, "--limit", "2"])
    assert "the data of lm-eval task hub_choice could not be fetched" in line and "Rowan/hellaswag" in line
    assert "HF_DATASETS_OFFLINE=1" in line and "dataset_path" in line and "HF_HOME" in line
