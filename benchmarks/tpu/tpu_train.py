"""Llama-3.2-1B training on one TPU chip through the `train` command: tokens/s and MFU per remat x attention.

Each configuration is one run of ``train --config llama-1b`` (16 layers, hidden 2048, GQA 32/8, vocab
128,256, tied; float32 weights, bfloat16 compute) at ``--seq-len`` 2048 on the python-stdlib corpus (its
BPE tokenizer of ``--tokenizer-vocab`` tokens; the model keeps the 128,256-row vocabulary, so the
embedding, the head and the loss cost what Llama 3's do), in a fresh process that holds the chip. The
figures are the trainer's own (`halyard.train.perf`): tokens/s over the logged windows after the first
step (which compiles) and MFU = `flops_per_token(seq_len)` x tokens/s / the chip's bfloat16 peak (TPU v5e:
197 TFLOP/s, the vendor's figure; remat recomputation is not counted). The median window of each run is
its figure. Once ``--steps`` steps are logged the process is killed (SIGKILL): the final checkpoint and
evaluation are not part of what is measured (benchmarks/tpu/run.sh's `tests` part tests saves on the TPU).

``--remat`` and ``--attention`` take several values (each pair is a run), passed to ``train`` as
``--model.remat`` and ``--model.attention_implementation`` (``--attention-key`` names another key).
Anything after ``--`` goes to every run's ``train`` as it is (``-- --model.num_layers 8``, or keys
newer than this script, e.g. a bfloat16-weights or optimizer-offload option). A run that fails (out of
memory, an unknown key) is a ``failed`` row with its last error line; the exit status is then 1.
Results: ``benchmarks/results/tpu_train.json`` (date, JAX version, device, the command, each run's
``train`` command and figures) and a Markdown table beside it.

    python benchmarks/tpu/tpu_train.py --remat save_dots full --attention xla --batch-size 8 --accumulation 4
    python benchmarks/tpu/tpu_train.py --steps 8 -- --model.num_layers 8        # what fits today, quickly
    python benchmarks/tpu/tpu_train.py --cpu-smoke                              # tiny, on CPU (the test suite)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
TRAIN = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
SMOKE_MODEL = [
    "--model.num_layers", "2", "--model.hidden_size", "64", "--model.intermediate_size", "128",
    "--model.num_heads", "4", "--model.num_kv_heads", "2", "--model.head_dim", "16", "--model.vocab_size", "512",
]  # fmt: skip


def train_arguments(args: argparse.Namespace, remat: str, attention: str, run_dir: Path) -> list[str]:
    """The ``train`` command line of one configuration."""
    return [
        "--config", "llama-1b",
        "--data.builtin_corpus", "python-stdlib",
        "--data.max_documents", str(args.max_documents),
        "--data.tokenizer_vocab_size", str(args.tokenizer_vocab),
        "--data.seq_len", str(args.seq_len),
        "--data.cache_dir", str(args.work_dir / "cache"),  # built by the first run, read by the others
        "--data.validation_fraction", "0",
        "--trainer.run_dir", str(run_dir),
        "--trainer.steps", str(args.steps + 100),  # killed after args.steps: no schedule end, no final save
        "--trainer.batch_size", str(args.batch_size),
        "--trainer.accumulation", str(args.accumulation),
        "--trainer.log_every", "1",
        "--trainer.progress", "false",
        "--trainer.plot", "false",
        "--optimizer.schedule.warmup", "0",
        "--checkpoint.every_steps", "null",
        "--checkpoint.every_seconds", "null",
        "--model.remat", remat,
        args.attention_key, attention,
        *(SMOKE_MODEL if args.cpu_smoke else []),
        *args.train_args,
    ]  # fmt: skip


def logged_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The training records ``metrics.jsonl`` holds so far (a half-written last line is skipped)."""
    path = run_dir / "metrics.jsonl"
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "loss" in record:
                records.append(record)
    return records


def run_configuration(args: argparse.Namespace, remat: str, attention: str) -> dict[str, Any]:
    """Train one configuration until ``args.steps`` steps are logged; its row of the table."""
    name = f"{remat}-{attention}".replace("/", "_")
    run_dir = args.work_dir / name
    arguments = train_arguments(args, remat, attention, run_dir)
    row: dict[str, Any] = {
        "remat": remat,
        "attention": attention,
        "train_command": shlex.join(["train", *arguments]),
    }
    log_path = args.work_dir / f"{name}.log"
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier call's run: its log would pass for this one's
    started = time.perf_counter()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", TRAIN, *arguments], stdout=log, stderr=subprocess.STDOUT
        )
        first_step_seconds = None
        records: list[dict[str, Any]] = []
        while process.poll() is None and time.perf_counter() - started < args.timeout:
            records = logged_steps(run_dir)
            if records and first_step_seconds is None:
                first_step_seconds = time.perf_counter() - started
            if len(records) >= args.steps:
                break
            time.sleep(0.5)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
    records = logged_steps(run_dir)
    if len(records) < args.steps:
        lines = [line for line in log_path.read_text().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")] or lines[-1:] or ["no output"]
        timed_out = time.perf_counter() - started >= args.timeout
        reason = f"timed out after {args.timeout} s" if timed_out else f"exit {process.returncode}"
        row["status"] = f"failed ({reason}, {len(records)} steps): {errors[-1][:300]}"
        return row
    windows = [record for record in records[: args.steps] if "tokens_per_second" in record]
    tokens_per_second = statistics.median(record["tokens_per_second"] for record in windows)
    row.update(
        status="ok",
        batch_size=args.batch_size,
        accumulation=args.accumulation,
        tokens_per_step=args.batch_size * args.seq_len,
        tokens_per_second=tokens_per_second,
        mfu=statistics.median(record["mfu"] for record in windows),
        step_seconds_median=args.batch_size * args.seq_len / tokens_per_second,
        tokens_per_second_windows=[record["tokens_per_second"] for record in windows],
        start_to_first_step_seconds=first_step_seconds,
        first_loss=records[0]["loss"],
        last_loss=records[args.steps - 1]["loss"],
        losses=[record["loss"] for record in records[: args.steps]],
    )
    return row


def markdown_table(result: dict[str, Any]) -> str:
    """The rows as the Markdown table benchmarks/README.md quotes."""
    lines = [
        f"{result['model']} on {result['device']}, seq {result['seq_len']}, {result['date']}, jax {result['jax']}",
        "",
        "| remat | attention | batch x accumulation | tokens/s | MFU | step (s) | start to step 1 (s) | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        if row["status"] == "ok":
            lines.append(
                f"| {row['remat']} | {row['attention']} | {row['batch_size']} x {row['accumulation']} "
                f"| {row['tokens_per_second']:,.0f} | {100 * row['mfu']:.1f}% | {row['step_seconds_median']:.3f} "
                f"| {row['start_to_first_step_seconds']:.0f} | ok |"
            )
        else:
            lines.append(f"| {row['remat']} | {row['attention']} | | | | | | {row['status']} |")
    return "\n".join(lines) + "\n"


def describe_device(cpu_smoke: bool) -> tuple[str, str]:
    """(device kind, jax version), read in a process of its own: this one must not hold the chip."""
    code = "import jax; print(jax.devices()[0].device_kind); print(jax.__version__)"
    env = dict(os.environ, JAX_PLATFORMS="cpu") if cpu_smoke else dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    kind, version = out.stdout.strip().splitlines()[-2:]
    return kind, version


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, train_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--remat", nargs="+", default=["save_dots"], help="model.remat values (default save_dots)"
    )
    parser.add_argument("--attention", nargs="+", default=["auto"], help="attention values (default auto)")
    parser.add_argument("--attention-key", default="--model.attention_implementation", help="the train key")
    parser.add_argument("--batch-size", type=int, default=None, help="sequences a step (8; smoke 4)")
    parser.add_argument(
        "--accumulation", type=int, default=1, help="microbatches a step (trainer.accumulation)"
    )
    parser.add_argument("--seq-len", type=int, default=None, help="tokens a sequence (2048; smoke 64)")
    parser.add_argument("--steps", type=int, default=None, help="steps logged per run (10; smoke 3)")
    parser.add_argument("--tokenizer-vocab", type=int, default=4096, help="the corpus tokenizer's vocabulary")
    parser.add_argument("--max-documents", type=int, default=3000, help="documents of the corpus used")
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds a run may take before it is failed"
    )
    parser.add_argument(
        "--work-dir", type=Path, default=Path("/tmp/halyard-tpu-train"), help="runs and cache"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "tpu_train.json")
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny model on CPU (the test suite)")
    args = parser.parse_args(own)
    args.train_args = train_args
    args.attention_key = "--" + args.attention_key.removeprefix("--")
    args.batch_size = args.batch_size or (4 if args.cpu_smoke else 8)
    args.seq_len = args.seq_len or (64 if args.cpu_smoke else 2048)
    args.steps = args.steps or (3 if args.cpu_smoke else 10)
    if args.cpu_smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"  # one device, as on one chip (not the test suite's eight)
        flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in flag]
        os.environ["XLA_FLAGS"] = " ".join(["--xla_force_host_platform_device_count=1", *flags])
        args.max_documents = min(args.max_documents, 30)
        args.tokenizer_vocab = 512  # the smoke model's vocabulary
    args.work_dir.mkdir(parents=True, exist_ok=True)
    device, jax_version = describe_device(args.cpu_smoke)
    print(f"{device}, jax {jax_version}; runs under {args.work_dir}", flush=True)

    rows = []
    for remat in args.remat:
        for attention in args.attention:
            row = run_configuration(args, remat, attention)
            rows.append(row)
            shown = (
                f"{row['tokens_per_second']:,.0f} tokens/s, MFU {100 * row['mfu']:.1f}%"
                if row["status"] == "ok"
                else row["status"]
            )
            print(f"remat {remat}, attention {attention}: {shown}", flush=True)
    result = {
        "benchmark": "tpu_train",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "benchmarks/tpu/tpu_train.py", *argv]),
        "jax": jax_version,
        "device": device,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "model": "llama-1b" + (" (smoke sizes)" if args.cpu_smoke else ""),
        "seq_len": args.seq_len,
        "train_args": train_args,
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown_table(result)
    args.output.with_suffix(".md").write_text(table)
    print("\n" + table + f"wrote {args.output} and {args.output.with_suffix('.md')}", flush=True)
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
