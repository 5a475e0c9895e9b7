"""Levanter's own train step beside Halyard's on the same chip: tokens/s and start to first step per setting.

Runs ``BUNDLE/run.sh`` (the Levanter bundle of ``../shared/levanter/``: ``bash ../shared/levanter/make_bundle.sh
.lev`` where pip reaches the registries, then carry ``.lev`` to the TPU machine) once per ``--setting``, each
``BATCH,MICROBATCH,REMAT`` (Levanter's `train_batch_size`, `per_device_parallelism` and remat policy), on
Llama-3.2-1B's shape at seq 2048 with bf16 parameters, as `tpu_train.py` runs Halyard's ``llama-1b``. Levanter
gets the machine's own JAX: Halyard's install (`tools/tpu_install.py`, under ``/tmp/halyard``) is taken off
``PYTHONPATH`` for its processes. Start to first step is Levanter's import, init and first (compiling) step, as
its script times them. With ``--halyard FILE...`` (`tpu_train.py` results of the same call) the ratio of each
file's best Halyard run to Levanter's best setting is printed and recorded.

    python3 benchmarks/tpu/tpu_levanter.py --setting 16,2,recompute 32,1,default --halyard out/halyard.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
PACKAGES = Path(__file__).resolve().parents[2] / "packages"


def levanter_environment(halyard_target: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``environ`` (default this process's) less Halyard's installed packages and this checkout's on
    ``PYTHONPATH`` (Levanter pins its own)."""
    halyard = (halyard_target, str(PACKAGES))
    paths = [p for p in environ.get("PYTHONPATH", "").split(":") if p and not p.startswith(halyard)]
    return dict(environ, PYTHONPATH=":".join(paths))


def run_setting(bundle: Path, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    """One Levanter run; its row (the bundle's ``lev.json`` figures, or the reason it failed)."""
    batch, microbatch, remat = setting.split(",")
    out = args.work_dir / setting.replace(",", "_")
    out.mkdir(parents=True, exist_ok=True)
    lev_args = (
        f"--num-layers {args.num_layers} --batch-size {batch} --microbatch {microbatch} --steps {args.steps} "
        f"--param-dtype bfloat16 --remat {remat} --seq-len {args.seq_len}"
    )
    env = levanter_environment(args.halyard_target) | {"OUT": str(out), "LEV_BUDGET_S": str(args.budget)}
    completed = subprocess.run(
        ["bash", str(bundle / "run.sh"), lev_args], env=env, capture_output=True, text=True
    )
    row: dict[str, Any] = {"setting": setting, "levanter_args": lev_args}
    result_file = out / "lev.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    if result.get("status") != "ok":
        tail = (completed.stdout + completed.stderr).strip().splitlines()[-3:]
        row["status"] = f"failed (exit {completed.returncode}): {result.get('error') or ' | '.join(tail)}"[
            :400
        ]
        return row
    row.update(
        status="ok",
        tokens_per_second=result["tokens_per_s"],
        step_seconds=result["median_step_s"],
        start_to_first_step_seconds=result["import_s"]
        + result["init_s"]
        + result["first_step_s_incl_compile"],
        import_seconds=result["import_s"],
        init_seconds=result["init_s"],
        first_step_seconds=result["first_step_s_incl_compile"],
        attention=result["attention"]["ran"]
        if isinstance(result["attention"], dict)
        else result["attention"],
        versions=result["versions"],
    )
    return row


def versus(path: Path, levanter: dict[str, Any]) -> dict[str, Any]:
    """The best run of a `tpu_train.py` result beside Levanter's best: tokens/s and start to first step."""
    rows = [row for row in json.loads(path.read_text())["rows"] if row["status"] == "ok"]
    if not rows:
        return {"halyard_result": str(path), "status": "no Halyard run completed"}
    best = max(rows, key=lambda row: row["tokens_per_second"])
    ratio = best["tokens_per_second"] / levanter["tokens_per_second"]
    print(
        f"{path.name}: Halyard {best['tokens_per_second']:,.0f} / Levanter {levanter['tokens_per_second']:,.0f} "
        f"tokens/s = {ratio:.3f}x; start to first step {best['start_to_first_step_seconds']:.0f} s / "
        f"{levanter['start_to_first_step_seconds']:.0f} s",
        flush=True,
    )
    return {
        "halyard_result": str(path),
        "halyard_train_command": best.get("train_command"),
        "halyard_over_levanter": ratio,
        "start_to_first_step": {
            "halyard": best["start_to_first_step_seconds"],
            "levanter": levanter["start_to_first_step_seconds"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--setting", nargs="+", default=["16,2,recompute"], help="BATCH,MICROBATCH,REMAT runs"
    )
    parser.add_argument(
        "--bundle", type=Path, default=Path(".lev"), help="the Levanter bundle (make_bundle.sh)"
    )
    parser.add_argument("--num-layers", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--budget", type=int, default=200, help="seconds a run may take, install included")
    parser.add_argument("--halyard", type=Path, nargs="*", default=[], help="tpu_train.py results to compare")
    parser.add_argument("--halyard-target", default="/tmp/halyard", help="tools/tpu_install.py's --target")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/levanter-runs"))
    parser.add_argument("--output", type=Path, default=RESULTS / "tpu_levanter.json")
    args = parser.parse_args(argv)
    if not (args.bundle / "run.sh").is_file():
        print(
            f"tpu_levanter: no {args.bundle}/run.sh: build it with bash ../shared/levanter/make_bundle.sh {args.bundle}"
        )
        return 2
    rows = []
    for setting in args.setting:
        row = run_setting(args.bundle, setting, args)
        rows.append(row)
        shown = f"{row['tokens_per_second']:,.0f} tokens/s" if row["status"] == "ok" else row["status"]
        print(f"levanter {setting}: {shown}", flush=True)
    result: dict[str, Any] = {
        "benchmark": "tpu_levanter",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(
            ["python3", "benchmarks/tpu/tpu_levanter.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "rows": rows,
    }
    ran = [row for row in rows if row["status"] == "ok"]
    if ran and args.halyard:
        best_levanter = max(ran, key=lambda row: row["tokens_per_second"])
        result["versus"] = [versus(path, best_levanter) for path in args.halyard if path.is_file()]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
