"""DPO with LoRA: the reference is the frozen base itself (no second copy of the weights, so the weights
the run started from are never loaded twice), and the adapters learn the preference."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_dpo_trainer import assert_first_step_at_the_reference, dpo_config_file, logged
from test_dpo_trainer import dpo_files as dpo_files  # a fixture this module's test uses
from trainer_fixtures import load_config

from halyard.train.run.setup import RunSetup
from halyard.train.trainer.trainer import Trainer


def test_dpo_with_lora_scores_against_the_base_without_a_copy(
    tmp_path: Path, dpo_files: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_copy(*args: object, **kwargs: object) -> None:
        raise AssertionError("a LoRA run's DPO reference is its frozen base, not a second copy")

    monkeypatch.setattr(RunSetup, "initial_model", no_copy)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    path = dpo_config_file(
        tmp_path, dpo_files, "lora", lora={"rank": 8, "alpha": 16.0, "target_modules": targets}
    )
    result = Trainer(load_config(path, "--optimizer.learning_rate", "0.03")).fit()
    assert sorted(result.state.params) == sorted(targets)  # only adapters trained
    steps = [row for row in logged(tmp_path / "lora") if "loss" in row]
    first, last = steps[0], steps[-1]
    # Step 1: the adapters' B is zero (their products add exact zeros), so the policy is the base, which is
    # the reference.
    assert_first_step_at_the_reference(first)
    assert last["loss"] < first["loss"] - 0.02 and last["rewards/margins"] > 0.02
