"""Run the suite's benchmarks (benchmarks/suite.py) and print their headline figures as one table.

Which scripts run, with which flags, and which figures are read back is data: `BENCHMARKS` in suite.py.
Each benchmark runs in its own process (so one's XLA flags, device count or memory cannot disturb the
next) with its own flags, writes its JSON result, and this script reads the JSON back and prints the
figures the performance issue sets targets for, next to their goals.

Usage::

    python benchmarks/run_all.py                      # full runs; results in benchmarks/results/
    python benchmarks/run_all.py --quick              # smoke test: tiny shapes, results in a temporary dir
    python benchmarks/run_all.py --only train_step scaling
    python benchmarks/run_all.py --list               # the benchmarks and their commands

Scripts that are not (yet) in benchmarks/ are reported as missing and skipped; a failing benchmark is
reported with the tail of its output and makes the exit code 1, the others still run. The table is also
written as JSON (``summary.json`` in the results directory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import BENCHMARKS, Benchmark, Figure  # benchmarks/suite.py: the scripts and their figures

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def lookup(result: dict[str, Any], dotted: str) -> Any:
    node: Any = result
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def format_value(figure: Figure, value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        scaled = value * figure.scale
        return f"{scaled:.3f}{figure.unit}" if abs(scaled) < 100 else f"{scaled:.1f}{figure.unit}"
    return str(value)


def run_one(benchmark: Benchmark, quick: bool, results_dir: Path, timeout: float) -> dict[str, Any]:
    """Run one script; returns ``{"status", "seconds", "output" (tail), "result" (its JSON or None)}``."""
    script = HERE / benchmark.script
    if not script.exists():
        return {"status": "missing", "seconds": 0.0, "output": f"{script} not found", "result": None}
    output_path = results_dir / f"{benchmark.name}.json"
    command = [sys.executable, str(script), *(benchmark.quick_args if quick else benchmark.full_args)]
    writes_json = '"--output"' in script.read_text()
    if writes_json:
        command += ["--output", str(output_path)]
    environment = {**os.environ, **benchmark.env}
    start = time.perf_counter()
    try:
        completed = subprocess.run(
            command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as error:
        tail = ((error.stdout or b"") if isinstance(error.stdout, bytes) else (error.stdout or "").encode())[
            -2000:
        ]
        return {
            "status": "timeout",
            "seconds": timeout,
            "output": tail.decode(errors="replace"),
            "result": None,
        }
    seconds = time.perf_counter() - start
    text = (completed.stdout or "") + (completed.stderr or "")
    if completed.returncode != 0 or not output_path.exists():
        return {
            "status": f"failed (exit {completed.returncode})",
            "seconds": seconds,
            "output": text[-3000:],
            "result": None,
        }
    return {
        "status": "ok",
        "seconds": seconds,
        "output": text[-3000:],
        "result": json.loads(output_path.read_text()),
    }


def table_rows(benchmark: Benchmark, run: dict[str, Any]) -> list[dict[str, str]]:
    """One row per figure found in the result (figures absent from the JSON are left out)."""
    rows = []
    result = run["result"] or {}
    for figure in benchmark.figures:
        if figure.path.startswith("stdout:"):
            match = re.search(figure.path.removeprefix("stdout:"), run["output"])
            value = match.group(1) if match else None
        else:
            value = lookup(result, figure.path)
        if value is None:
            continue
        verdict = ""
        if figure.check is not None and isinstance(value, int | float) and not isinstance(value, bool):
            verdict = "met" if figure.check(value) else "NOT met"
        rows.append(
            {"benchmark": benchmark.name, "figure": figure.label, "value": format_value(figure, value),
             "goal": figure.goal, "verdict": verdict}
        )  # fmt: skip
    if not rows:
        rows.append(
            {"benchmark": benchmark.name, "figure": run["status"], "value": "", "goal": "", "verdict": ""}
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="every benchmark in its --quick mode (smoke test)"
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="default: benchmarks/results (full), a temp dir (quick)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per benchmark (default 3600; quick 600)"
    )
    parser.add_argument(
        "--list", action="store_true", help="list the benchmarks and their commands, run nothing"
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: print the table from the JSON already in the results dir",
    )
    args = parser.parse_args(argv)

    names = [b.name for b in BENCHMARKS]
    unknown = [n for n in args.only or [] if n not in names]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {names}")
    selected = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    if args.list:
        for b in selected:
            flags = " ".join(b.full_args)
            present = "" if (HERE / b.script).exists() else "   (missing)"
            print(f"{b.name:>20}: python benchmarks/{b.script} {flags}".rstrip() + present)
        return 0
    results_dir = args.results_dir or (
        Path(tempfile.mkdtemp(prefix="halyard-bench-")) if args.quick else HERE / "results"
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    timeout = args.timeout or (600.0 if args.quick else 3600.0)

    rows: list[dict[str, str]] = []
    runs: dict[str, dict[str, Any]] = {}
    failed = False
    for benchmark in selected:
        print(f"--- {benchmark.name} ({'quick' if args.quick else 'full'}) ...", flush=True)
        if args.collect:
            path = results_dir / f"{benchmark.name}.json"
            found = path.exists()
            result = json.loads(path.read_text()) if found else None
            run = {"status": "ok" if found else "no result", "seconds": 0.0, "output": "", "result": result}
        else:
            run = run_one(benchmark, args.quick, results_dir, timeout)
        runs[benchmark.name] = run
        print(f"    {run['status']} in {run['seconds']:.1f} s", flush=True)
        if run["status"] not in ("ok", "missing", "no result"):
            failed = True
            print(run["output"], flush=True)
        rows.extend(table_rows(benchmark, run))

    widths = {
        key: max(len(key), *(len(r[key]) for r in rows))
        for key in ("benchmark", "figure", "value", "goal", "verdict")
    }
    header = "  ".join(key.ljust(widths[key]) for key in widths)
    print("\n" + header + "\n" + "-" * len(header))
    for row in rows:
        print("  ".join(row[key].ljust(widths[key]) for key in widths))
    summary = {
        "quick": args.quick,
        "rows": rows,
        "runs": {name: {"status": r["status"], "seconds": r["seconds"]} for name, r in runs.items()},
    }
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nresults in {results_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
