"""The README's quick start runs as written, and the benchmark script runs in its quick mode."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from data_helpers import make_documents, write_jsonl_shards

PACKAGE = Path(__file__).resolve().parent.parent
REPOSITORY = PACKAGE.parent.parent


def quick_start_blocks() -> list[str]:
    text = (PACKAGE / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_readme_quick_start_runs(tmp_path: Path, tokenizer_path: str, monkeypatch, capsys):
    write_jsonl_shards(tmp_path / "data", make_documents(200, seed=60), num_shards=2)
    (tmp_path / "tokenizer.json").write_text(Path(tokenizer_path).read_text())
    monkeypatch.chdir(tmp_path)
    blocks = quick_start_blocks()
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "__main__"})
    output = capsys.readouterr().out
    assert "200 documents" in output
    assert (tmp_path / "cache" / "ledger.json").exists()


def test_benchmark_quick_mode_writes_its_results(tmp_path: Path):
    output = tmp_path / "data_cache.json"
    environment = {**os.environ, "RAYON_NUM_THREADS": "2"}
    completed = subprocess.run(
        [sys.executable, str(REPOSITORY / "benchmarks" / "data" / "data_cache.py"), "--quick", "--megabytes", "0.3",
         "--workers", "2", "--output", str(output)],
        capture_output=True, text=True, timeout=600, env=environment,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "build throughput / raw encode_batch" in completed.stdout
    results = json.loads(output.read_text())
    for key in [
        "build_over_raw_encode_ratio",
        "seconds_to_first_batch",
        "loader_over_train_step_consumption",
    ]:
        assert results[key] > 0
    assert results["tokens"] > 0 and results["quick"] is True
