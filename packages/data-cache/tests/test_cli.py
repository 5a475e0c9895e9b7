"""The command line: build (and resume/refuse) and info."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from data_helpers import make_documents, write_jsonl

from halyard.data import CacheMismatchError, TokenCache
from halyard.data.cli import main


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
    with pytest.raises(CacheMismatchError, match="bos_id"):
        main([*arguments, "--bos", "<s>"])
    assert main([*arguments, "--bos", "<s>", "--rebuild"]) == 0
    assert TokenCache.open(out).processor_metadata["bos_token"] == "<s>"
