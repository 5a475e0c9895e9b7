"""The `train` / `halyard` command line: config mistakes exit with code 2 and name the key; help works."""

from __future__ import annotations

from pathlib import Path

import pytest

from halyard.train.cli import builtin_configs, main, train_main


def _exit_code_and_stderr(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as raised:
        train_main(argv)
    return int(raised.value.code), capsys.readouterr().err


def test_unknown_model_key_is_named_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _exit_code_and_stderr(capsys, ["--config", "demo", "--model.num_layrs", "3"])
    assert code == 2
    assert "model.num_layrs" in err and "Did you mean 'model.num_layers'" in err
    assert "Traceback" not in err


def test_wrong_type_missing_file_and_bad_value(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = _exit_code_and_stderr(capsys, ["--config", "demo", "--trainer.steps", "many"])
    assert code == 2 and "trainer.steps" in err and "int" in err
    code, err = _exit_code_and_stderr(capsys, ["--config", str(tmp_path / "missing.yaml")])
    assert code == 2 and "missing.yaml" in err
    code, err = _exit_code_and_stderr(capsys, ["--config", "demo", "--trainer.init", "bogus"])
    assert code == 2 and "trainer.init='bogus'" in err
    code, err = _exit_code_and_stderr(capsys, ["--config", "demo", "--data.seq_len", "4096"])
    assert code == 2 and "data.seq_len=4096 exceeds model.max_position=256" in err
    code, err = _exit_code_and_stderr(capsys, ["--config", "demo", "--trainer.mesh.data", "3"])
    assert code == 2 and "3" in err
    code, err = _exit_code_and_stderr(capsys, ["--config", "demo", "--model.type", "llamma"])
    assert code == 2 and "llama" in err


def test_help_lists_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        train_main(["--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    for key in ("--trainer.steps", "--model.num_layers", "--data.seq_len", "--optimizer.learning_rate"):
        assert key in out


def test_halyard_lists_builtin_configs_and_refuses_unknown_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "demo" in builtin_configs()
    assert main(["configs"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err


def test_generate_eval_and_export_use_a_runs_latest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer_fixtures import load_config, write_config

    from halyard.train.trainer.trainer import Trainer

    run = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        run,
        tmp_path / "cache",
        data={"validation_fraction": 0.1},
        trainer={"steps": 2, "eval_batches": 1},
    )
    Trainer(load_config(config)).fit()
    capsys.readouterr()
    assert main(["generate", "--run", str(run), "--prompt", "def ", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    assert main(["eval", "--run", str(run)]) == 0
    report = capsys.readouterr().out.strip().splitlines()[-1]
    assert '"eval_bits_per_byte"' in report and '"step": 2' in report
    with pytest.raises(SystemExit) as raised:
        main(["eval", "--run", str(tmp_path / "no-such-run")])
    assert raised.value.code == 2


def test_a_sections_own_check_is_said_in_the_keys_terms(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _exit_code_and_stderr(capsys, ["--config", "demo", "--trainer.batch_size", "0"])
    assert (
        code == 2
        and err.strip() == "error: trainer.batch_size=0: must be at least 1 (set in the command line)"
    )


def test_an_unknown_config_name_lists_the_builtin_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["config", "show", "dmeo"])
    err = capsys.readouterr().err.strip()
    assert raised.value.code == 2 and err.startswith("error: --config dmeo: no such file") and "\n" not in err
    assert "did you mean demo?" in err and f"built-in configs: {', '.join(sorted(builtin_configs()))}" in err


def test_help_says_which_defaults_apply(capsys: pytest.CaptureFixture[str]) -> None:
    from halyard.models import ModelConfig

    with pytest.raises(SystemExit):
        train_main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    families = sorted(ModelConfig.get_known_choices())
    type_line = next(line for line in lines if line.startswith("  --model.type "))
    assert type_line.split(" = ")[0].split(None, 1)[1].split(" | ") == families  # from the registry
    header = next(line for line in lines if line.startswith("model: "))
    assert not any(f"{family}," in header for family in families), header  # no copy of the list to go stale
    llama = next(line for line in lines if line.startswith("model, type: llama:"))
    assert "7B" not in llama.split(";")[0] and "defaults below are this config's" in llama, llama
    mistral = next(line for line in lines if line.startswith("model, type: mistral:"))
    assert "hidden_size=4096" in mistral and "num_layers=32" in mistral, (
        mistral
    )  # not llama's 128 and 2 above
    cache_dir = next(line for line in lines if line.startswith("  --data.cache_dir "))
    assert "<cache_dir>/tokens" in cache_dir and "<run_dir>/cache" in cache_dir
