"""The command line: build (and resume/refuse) and info."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from data_helpers import make_documents, write_jsonl

from halyard.data import CacheMismatchError, TokenCache
from halyard.data.cli import main, run_command


def test_build_then_info_reports_totals_and_counters(tmp_path: Path, tokenizer_path: str, capsys):
    write_jsonl(tmp_path / "src" / "a.jsonl", make_documents(30, seed=50))
    (tmp_path / "src" / "b.jsonl").write_text('{"text": "fine"}\nnot json\n')
    out = str(tmp_path / "cache")
    arguments = [
        "build",
        "--source",
        str(tmp_path / "src" / "*.jsonl"),
        "--tokenizer",
        tokenizer_path,
        "--out",
        out,
        "--workers",
        "0",
        "--no-progress",
    ]
    assert main(arguments) == 0
    assert "31 documents" in capsys.readouterr().out
    assert main(["info", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["finished"] and info["documents"] == 31 and info["shards"] == 2
    assert info["bad_records"]["malformed_json"] == 1
    assert info["fingerprint"] == TokenCache.open(out).fingerprint
    assert main([*arguments, "--bos", "<s>"]) == 2  # a cache of other settings: refused, one line
    assert "bos_id" in capsys.readouterr().err
    with pytest.raises(CacheMismatchError, match="bos_id"):
        run_command([*arguments, "--bos", "<s>"])
    assert main([*arguments, "--bos", "<s>", "--rebuild"]) == 0
    assert TokenCache.open(out).processor_metadata["bos_token"] == "<s>"


def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, tokenizer_path: str, capsys, monkeypatch):
    argv = ["build", "--source", str(tmp_path / "none-*.jsonl"), "--tokenizer", tokenizer_path]
    assert main([*argv, "--out", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: source") and "none-*.jsonl" in err and len(err.splitlines()) == 1
    monkeypatch.setenv("HALYARD_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="matches no file"):
        main([*argv, "--out", str(tmp_path / "cache")])
