"""The precedence rule holds key by key on the `train` command line: switching a section's `type:` keeps
the file's values that the new type also has; `include:` finds built-in configs; model shapes that the
rotary embedding cannot use are refused at config time."""

from __future__ import annotations

from pathlib import Path

import pytest

from halyard.train.cli import resolve_config_paths
from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import parse_config
from halyard.train.run_config import TrainConfig


def demo(*overrides: str) -> TrainConfig:
    return parse_config(TrainConfig, resolve_config_paths(["--config", "demo", *overrides]))


def test_switching_the_optimizer_keeps_the_files_learning_rate_and_schedule() -> None:
    config = demo("--optimizer.type", "lion")
    assert type(config.optimizer).__name__ == "LionConfig"
    assert config.optimizer.learning_rate == 0.003 and config.optimizer.schedule.warmup == 30
    assert config.optimizer.beta2 == 0.99  # lion's own default, not adamw's 0.95


def test_a_type_switch_and_a_key_below_it_on_one_command_line() -> None:
    config = demo("--optimizer.type", "lion", "--optimizer.schedule.warmup", "5")
    assert config.optimizer.schedule.warmup == 5 and config.optimizer.learning_rate == 0.003
    wsd = demo("--optimizer.type", "muon", "--optimizer.schedule.type", "wsd").optimizer.schedule
    assert type(wsd).__name__ == "WSDScheduleConfig" and wsd.warmup == 30


def test_switching_the_model_family_keeps_shared_fields_and_names_the_dropped_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = demo("--model.type", "gpt2")
    assert type(config.model).__name__ == "Gpt2Config"
    assert (config.model.num_heads, config.model.hidden_size, config.model.num_layers) == (4, 128, 4)
    err = capsys.readouterr().err
    assert "dropped model.num_kv_heads (set in" in err and "demo.yaml:10" in err
    assert "model.type gpt2 (set in the command line) has no such field" in err


def test_include_finds_a_builtin_config_and_a_type_switch_in_the_file_keeps_its_values(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("include: demo\noptimizer:\n  type: sophia_h\ntrainer:\n  steps: 7\n")
    config = parse_config(TrainConfig, ["--config", str(path)])
    assert config.trainer.steps == 7 and config.model.hidden_size == 128
    assert type(config.optimizer).__name__ == "SophiaHConfig" and config.optimizer.learning_rate == 0.003


@pytest.mark.parametrize("family", ["llama", "mistral", "mixtral", "qwen2"])
def test_a_head_size_without_rotary_pairs_is_a_config_error(family: str) -> None:
    overrides = ["--model.type", family, "--model.hidden_size", "32", "--model.num_heads", "32"]
    with pytest.raises(ConfigError, match=r"num_heads=32 gives head_size 1, so rotary_dim 1.*even"):
        demo(*overrides, "--model.num_kv_heads", "1")
