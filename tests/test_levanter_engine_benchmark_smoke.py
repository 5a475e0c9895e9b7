"""benchmarks/tpu/tpu_levanter_engine.py: Halyard's serving engine beside Levanter's on the same weights and
requests. The whole driver runs (``--cpu-smoke``) only where Levanter is installed (CI has none); how Levanter's
engine is fed its requests is checked everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "benchmarks" / "tpu" / "tpu_levanter_engine.py"
sys.path.insert(0, str(ROOT / "benchmarks" / "tpu"))
from levanter_engine_arm import groups_of  # noqa: E402  (the arm imports Levanter only inside functions)

LEVANTER_SITE = os.environ.get("HALYARD_LEVANTER_SITE")
LEVANTER_PYTHON = os.environ.get("HALYARD_LEVANTER_PYTHON", "python3")
INSTALL = (
    "python3 -m venv V && V/bin/pip install jax==0.10.2 && LEV_SITE=DIR PYTHON=V/bin/python bash .lev/install.sh "
    "(.lev: bash ../shared/levanter/make_bundle.sh .lev), then HALYARD_LEVANTER_SITE=DIR "
    "HALYARD_LEVANTER_PYTHON=V/bin/python"
)


def test_levanter_gets_its_requests_in_arrival_order_in_groups_one_prefill_admits() -> None:
    requests = [([0] * length, 4) for length in (5, 5, 5, 9, 2, 2)]
    assert groups_of(requests, prefill_tokens=10, seqs=2) == [[0, 1], [2], [3], [4, 5]]
    assert groups_of(requests, prefill_tokens=100, seqs=4) == [[0, 1, 2, 3], [4, 5]]
    with pytest.raises(ValueError, match="exceeds max_prefill_size 8"):
        groups_of(requests, prefill_tokens=8, seqs=4)


def test_the_driver_refuses_a_missing_bundle(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(DRIVER), "--bundle", str(tmp_path / "none-here"), "--work-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert completed.returncode == 2 and "make_bundle.sh" in completed.stderr, completed.stderr


@pytest.mark.skipif(LEVANTER_SITE is None, reason=f"Levanter is not installed here (CI has none): {INSTALL}")
def test_both_engines_serve_the_same_requests_with_the_same_tokens(tmp_path: Path) -> None:
    """On a tiny float32 Llama both engines give every request its tokens, the same greedy ones (the same
    weights read the same way by both), and the driver's JSON holds both figures and their ratio."""
    output = tmp_path / "versus.json"
    completed = subprocess.run(
        [sys.executable, str(DRIVER), "--cpu-smoke", "--bundle", "none", "--levanter-site", str(LEVANTER_SITE),
         "--levanter-python", LEVANTER_PYTHON, "--work-dir", str(tmp_path / "work"), "--output", str(output)],
        capture_output=True, text=True, timeout=1200, cwd=ROOT,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    result = json.loads(output.read_text())
    wanted = result["request_set"]["output_tokens_total"]
    assert result["request_set"]["requests"] == 8 and result["date"] and "--cpu-smoke" in result["command"]
    (halyard,) = result["halyard"]["rows"]
    (levanter,) = result["levanter"]["rows"]
    for row in (halyard, levanter):
        assert row["status"] == "ok" and row["output_tokens"] == wanted, row
        assert 0 < row["ttft_p50"] <= row["ttft_p90"] <= row["seconds"]
    assert result["levanter"]["versions"]["marin-levanter"].startswith("0.2.20")
    assert result["halyard"]["versions"]["jax"] == result["levanter"]["versions"]["jax"]
    versus = result["versus"]
    assert versus["same_first_token"] == 1.0 and versus["same_kept_tokens"] == 1.0, versus
    ratio = halyard["output_tokens_per_second"] / levanter["output_tokens_per_second"]
    assert versus["halyard_over_levanter_output_tokens_per_second"] == pytest.approx(ratio)
