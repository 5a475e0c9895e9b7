"""parse_config: layering of defaults, files and overrides; `type:` choices; round trip; --help."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from halyard.train.config.parse import config_help, parse_config, save_resolved_config

sys.path.insert(0, str(Path(__file__).parent))
from config_example import ConstantSection, CosineSection, ExampleConfig, LoopSection


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults_when_nothing_is_given():
    assert parse_config(ExampleConfig, []) == ExampleConfig()


def test_dotted_overrides_in_both_spellings():
    config = parse_config(
        ExampleConfig, ["--trainer.steps", "200", "--name=run7", "--trainer.learning_rate", "1e-3"]
    )
    assert config.trainer == LoopSection(steps=200, learning_rate=1e-3)
    assert config.name == "run7"


def test_command_line_overrides_file_which_overrides_defaults(tmp_path):
    path = write(tmp_path / "run.yaml", "trainer:\n  steps: 5\n  learning_rate: 0.5\nname: from_file\n")
    config = parse_config(ExampleConfig, ["--config", str(path), "--trainer.steps", "7"])
    assert config == ExampleConfig(trainer=LoopSection(steps=7, learning_rate=0.5), name="from_file")
    assert parse_config(ExampleConfig, [], config_path=path).trainer.steps == 5


def test_choice_selected_by_type_in_file_and_on_command_line(tmp_path):
    path = write(tmp_path / "run.yaml", "schedule:\n  type: constant\n  warmup_steps: 3\n")
    assert parse_config(ExampleConfig, [], path).schedule == ConstantSection(warmup_steps=3)
    config = parse_config(ExampleConfig, ["--schedule.type", "constant"])
    assert config.schedule == ConstantSection()


def test_override_inside_default_choice_keeps_its_type_and_values():
    config = parse_config(ExampleConfig, ["--schedule.warmup_steps", "4"])
    assert config.schedule == CosineSection(warmup_steps=4, final_fraction=0.2)


def test_switching_type_keeps_the_values_the_new_type_has_and_names_the_dropped_ones(tmp_path, capsys):
    path = write(
        tmp_path / "run.yaml", "schedule:\n  type: cosine\n  warmup_steps: 9\n  final_fraction: 0.5\n"
    )
    config = parse_config(ExampleConfig, ["--schedule.type", "constant"], path)
    assert config.schedule == ConstantSection(warmup_steps=9)
    assert "dropped schedule.final_fraction (set in" in capsys.readouterr().err
    # The old type's defaults are not carried over: only values a file or the command line set.
    assert parse_config(ExampleConfig, ["--schedule.type", "constant"]).schedule == ConstantSection()


def test_list_values_are_read_as_yaml():
    assert parse_config(ExampleConfig, ["--trainer.tags", "[a, b]"]).trainer.tags == ("a", "b")


def test_include_merges_deeply_and_the_including_file_wins(tmp_path):
    (tmp_path / "base").mkdir()
    write(tmp_path / "base" / "common.yaml", "trainer:\n  steps: 11\n  learning_rate: 0.25\nname: base\n")
    write(tmp_path / "base" / "schedule.yaml", "schedule:\n  type: constant\n")
    path = write(
        tmp_path / "run.yaml", "include: [base/common.yaml, base/schedule.yaml]\ntrainer:\n  steps: 12\n"
    )
    config = parse_config(ExampleConfig, [], path)
    assert config == ExampleConfig(
        trainer=LoopSection(steps=12, learning_rate=0.25), schedule=ConstantSection(), name="base"
    )


def test_single_include_string_and_nested_include_chain(tmp_path):
    write(tmp_path / "a.yaml", "name: from_a\n")
    write(tmp_path / "b.yaml", "include: a.yaml\ntrainer:\n  steps: 3\n")
    path = write(tmp_path / "c.yaml", "include: b.yaml\n")
    assert parse_config(ExampleConfig, [], path) == ExampleConfig(trainer=LoopSection(steps=3), name="from_a")


def test_resolved_config_round_trips(tmp_path):
    config = parse_config(
        ExampleConfig, ["--trainer.steps", "42", "--trainer.tags", "[x]", "--schedule.final_fraction", "0.05"]
    )
    written = save_resolved_config(config, tmp_path / "run")
    assert written == tmp_path / "run" / "config.yaml"
    assert "type: cosine" in written.read_text()
    assert parse_config(ExampleConfig, [], written) == config
    other = ExampleConfig(schedule=ConstantSection(warmup_steps=1))
    assert parse_config(ExampleConfig, [], save_resolved_config(other, tmp_path / "run2")) == other


def test_help_lists_every_option_with_default_and_doc():
    text = config_help(ExampleConfig, prog="train")
    for option, doc, default in [
        ("--trainer.steps", "Number of optimizer steps.", "100"),
        ("--trainer.learning_rate", "Peak learning rate.", "0.0003"),
        ("--schedule.final_fraction", "Learning rate at the end", "0.2"),  # ExampleConfig's, not the class's
        ("--schedule.warmup_steps", "Steps of linear warmup.", "10"),
        ("--name", "Run name.", "example"),
    ]:
        line = next(line for line in text.splitlines() if line.startswith(f"  {option} "))
        assert doc in line and f" = {default} " in line
    assert "--schedule.type constant | cosine = cosine" in text


def test_help_flag_prints_help_and_exits_zero(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(ExampleConfig, ["--help"], prog="train")
    assert exit_info.value.code == 0
    assert "--trainer.steps" in capsys.readouterr().out
