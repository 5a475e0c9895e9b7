"""Config mistakes: each is a ConfigError naming the key or file, and `main` exits with code 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from halyard.train.config.errors import ConfigError, exit_on_config_error
from halyard.train.config.parse import parse_config

sys.path.insert(0, str(Path(__file__).parent))
from config_example import ExampleConfig


def error_of(argv: list[str], path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(ExampleConfig, argv, path)
    return str(info.value)


def test_unknown_command_line_key_is_named_with_a_suggestion():
    message = error_of(["--trainer.stepz", "200"])
    assert "unknown config key 'trainer.stepz'" in message
    assert "the command line" in message
    assert "Did you mean 'trainer.steps'?" in message


def test_misspelt_section_name_is_suggested():
    assert "Did you mean 'trainer'?" in error_of(["--trainr.steps", "1"])


def test_unknown_file_key_names_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  learning_rat: 0.1\n")
    message = error_of([], path)
    assert "'trainer.learning_rate'" in message
    assert str(path) in message


def test_unknown_key_names_file_and_line_also_inside_an_include(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\ntrainer:\n  steps: 3\n  warmup: 2\n")
    path = tmp_path / "run.yaml"
    path.write_text("include: base.yaml\ntrainer:\n  steps: 5\n")
    message = error_of([], path)
    assert f"unknown config key 'trainer.warmup' in {tmp_path / 'base.yaml'}:4" in message
    path.write_text("include: base.yaml\n\nschedule:\n  type: cosin\n")
    (tmp_path / "base.yaml").write_text("name: base\n")
    assert f"for config section 'schedule' in {path}:4" in error_of([], path)


def test_removed_trainer_precision_names_the_model_keys_that_replace_it(tmp_path):
    from halyard.train.run_config import TrainConfig

    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  steps: 3\n  precision:\n    compute: bfloat16\n")
    for argv, where in (([], f"{path}:4"), (["--trainer.precision.params", "float32"], "the command line")):
        with pytest.raises(ConfigError) as info:
            parse_config(TrainConfig, argv, None if argv else path)
        message = str(info.value)
        key = "trainer.precision.params" if argv else "trainer.precision.compute"
        assert message.startswith(f"config key '{key}' in {where} was removed:"), message
        assert "model.param_dtype" in message and "model.compute_dtype" in message
        assert "\n" not in message


def test_wrong_type_in_a_file_names_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("name: x\ntrainer:\n  steps: lots\n")
    message = error_of([], path)
    assert f"config key 'trainer.steps' (set in {path}:3)" in message
    assert "expected int" in message
    assert "(set in the command line)" in error_of(["--trainer.steps", "lots"], path)


def test_key_of_another_choice_is_unknown_for_the_selected_one():
    message = error_of(["--schedule.type", "constant", "--schedule.final_fraction", "0.5"])
    assert "schedule.final_fraction" in message
    assert "ConstantSection has no field" in message


def test_unknown_type_lists_the_choices_and_suggests():
    message = error_of(["--schedule.type", "cosin"])
    assert "unknown type 'cosin'" in message
    assert "constant, cosine" in message
    assert "Did you mean 'cosine'?" in message


def test_wrong_type_names_key_and_expected_type():
    message = error_of(["--trainer.steps", "many"])
    assert "'trainer.steps'" in message
    assert "expected int" in message
    assert "'many'" in message
    assert "expected float" in error_of(["--schedule.final_fraction", "high"])


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert f"config file not found: {missing}" in error_of(["--config", str(missing)])


def test_missing_include_names_both_files(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("include: base.yaml\n")
    message = error_of([], path)
    assert str(tmp_path / "base.yaml") in message
    assert f"included from {path.resolve()}" in message


def test_include_cycle_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("include: b.yaml\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    assert "include cycle" in error_of([], tmp_path / "a.yaml")


def test_malformed_yaml_and_non_mapping_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    assert "is not valid YAML" in error_of([], bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    assert "must hold a mapping" in error_of([], scalar)


def test_malformed_command_lines():
    assert "needs a value" in error_of(["--trainer.steps"])
    assert "unexpected command-line argument 'steps'" in error_of(["steps", "3"])


def test_exit_on_config_error_passes_other_results_through():
    assert exit_on_config_error(lambda value: value + 1)(1) == 2


def test_program_exits_with_code_2_and_no_traceback(tmp_path):
    tests_dir = Path(__file__).parent
    script = tmp_path / "program.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(tests_dir)!r})
            from config_example import ExampleConfig
            from halyard.train.config.errors import exit_on_config_error
            from halyard.train.config.parse import parse_config

            @exit_on_config_error
            def main():
                print(parse_config(ExampleConfig, sys.argv[1:]).trainer.steps)

            main()
            """
        )
    )
    bad = subprocess.run(
        [sys.executable, str(script), "--trainer.stepz", "3"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.startswith("error: unknown config key 'trainer.stepz'")
    assert "Did you mean 'trainer.steps'?" in bad.stderr
    good = subprocess.run(
        [sys.executable, str(script), "--trainer.steps", "3"], capture_output=True, text=True
    )
    assert (good.returncode, good.stdout.strip()) == (0, "3")
