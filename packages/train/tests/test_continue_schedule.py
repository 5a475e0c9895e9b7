"""Continuing a finished run to a higher ``trainer.steps`` keeps its learning rate where the schedule ended
(``trainer.continue_schedule: hold``) or runs the schedule again over the added steps (``restart``), and says
which in one line; an interrupted run resumes its schedule unchanged (issue 34: the cosine was re-stretched
over the new steps, the learning rate jumping back up at the first added step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from float_tolerance import SCHEDULE_TERMS, summation_tolerance
from trainer_fixtures import write_config

from halyard.train.cli import main
from halyard.train.run.schedule_plan import plan_segments


def learning_rates(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {record["step"]: record["learning_rate"] for record in records if "learning_rate" in record}


def test_a_finished_run_continues_at_its_last_learning_rate_or_restarts_its_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        run_dir,
        tmp_path / "cache",
        optimizer={"learning_rate": 0.01, "schedule": {"type": "cosine", "warmup": 2, "min_lr_ratio": 0.1}},
        trainer={"steps": 8},
        checkpoint={"every_steps": 4},
    )
    train = ["train", "--config", str(config)]
    assert main(train) == 0
    final = learning_rates(run_dir)[8]
    close = {"abs": summation_tolerance(0.01, SCHEDULE_TERMS), "rel": 0}  # a float32 schedule at peak 0.01
    assert final == pytest.approx(0.001, **close)  # the cosine's end: min_lr_ratio * peak
    capsys.readouterr()

    assert main([*train, "--trainer.steps", "12"]) == 0
    assert (
        "learning rate: the run's schedule ended at step 8; steps 9-12 keep its last learning rate, 0.001 "
        "(trainer.continue_schedule=hold; restart warms up and decays again)"
    ) in capsys.readouterr().out.splitlines()
    rates = learning_rates(run_dir)
    assert [rates[step] for step in range(9, 13)] == [final] * 4  # no jump back up the cosine

    assert main([*train, "--trainer.steps", "16", "--trainer.continue_schedule", "restart"]) == 0
    assert (
        "learning rate: the run's schedule ended at step 8; steps 13-16 run it again (warmup to 0.01, then its "
        "decay) (trainer.continue_schedule=restart; hold keeps the last learning rate)"
    ) in capsys.readouterr().out.splitlines()
    rates = learning_rates(run_dir)
    assert rates[13] == pytest.approx(0.005, **close) and rates[14] == pytest.approx(
        0.01, **close
    )  # warmup: 2
    assert rates[16] == pytest.approx(0.001, **close) and rates[15] < rates[14]


def test_the_plan_of_segments() -> None:
    fresh = plan_segments(None, None, 20, "hold")
    assert fresh.segments == ((0, 20),) and not fresh.continued
    # Interrupted at 10 of 20: the same schedule (bitwise resume); with another target, planned anew.
    assert plan_segments([(0, 20)], 10, 20, "hold").segments == ((0, 20),)
    assert plan_segments([(0, 20)], 10, 30, "restart").segments == ((0, 30),)
    # Finished at 20, continued to 30.
    held = plan_segments([(0, 20)], 20, 30, "hold")
    assert held.segments == ((0, 20),) and held.continued
    restarted = plan_segments([(0, 20)], 20, 30, "restart")
    assert restarted.segments == ((0, 20), (20, 30)) and restarted.continued
    # The restarted segment interrupted at 25 resumes unchanged; a run held past its end stays held.
    assert plan_segments([(0, 20), (20, 30)], 25, 30, "restart").segments == ((0, 20), (20, 30))
    assert plan_segments([(0, 20)], 25, 40, "hold").segments == ((0, 20),)
