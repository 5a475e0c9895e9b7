"""`trainer.init=hf:PATH` reads config.json by the family's key rule; `--trainer.hf_strict_config true`
refuses anything the rule does not name, before any data is prepared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import load_config, save_tiny_hf_llama, write_config

from halyard.train.cli import main
from halyard.train.trainer.trainer import Trainer


def test_unread_keys_are_ignored_unless_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = save_tiny_hf_llama(tmp_path / "hf")
    config_json = folder / "config.json"
    # the keys SmolLM2's published config.json carries that transformers does not read
    config_json.write_text(
        json.dumps(
            {**json.loads(config_json.read_text()), "is_llama_config": True, "rope_interleaved": False}
        )
    )
    run = write_config(
        tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", trainer={"init": f"hf:{folder}"}
    )
    assert Trainer(load_config(run)).model_config.family == "llama"

    capsys.readouterr()
    with pytest.raises(SystemExit) as raised:
        main(["train", "--config", str(run), "--trainer.hf_strict_config", "true"])
    err = capsys.readouterr().err.strip()
    assert raised.value.code == 2 and len(err.splitlines()) == 1, err
    assert "['is_llama_config']" in err and "strict=True refuses" in err
    assert not (tmp_path / "cache").exists()
