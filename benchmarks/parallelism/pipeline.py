"""Pipeline parallelism: memory per device, the schedule's bubble and the bytes passed between stages.

Everything is read from compiled programs (XLA's memory analysis and HLO; nothing runs at full size):

- **Memory**: the trainer's own train step (`halyard plan`'s `step_memory`) of a Llama 3.1 8B-shaped
  stack (32 layers, seq 4096, 64 sequences a step, remat full) on 8 devices: ``stage`` S = 1, 2, 4, 8 with
  the other ``8 / S`` devices on ``fsdp`` (S = 1 is plain FSDP), 8 microbatches.
- **Bubble**: the compiled program has a forward and a backward loop of ``R M + S - 1`` iterations that
  pass data between stages; a stage idles in ``(iterations - R M) / iterations`` of them, beside
  ``(S - 1) / (R M + S - 1)``.
- **Bytes between stages**: the collective permutes of the compiled pipeline loops, times their trip
  counts: what a device sends in a step, and that in activations of one microbatch (``[mb, seq, embed]``,
  float32 as XLA's CPU backend sends bfloat16) per iteration. The forward passes two per iteration (each
  stage's output to the next stage; the last stage's output to the first stage's buffer), the backward
  their cotangents and one more; the rest are the microbatches' int32 positions and segment ids.

Usage::

    python benchmarks/parallelism/pipeline.py            # Llama 3.1 8B shape (minutes)
    python benchmarks/parallelism/pipeline.py --quick    # a tiny model, S = 1 and 2 (a minute)

Results are printed and written as JSON (``--output``, default benchmarks/results/pipeline.json).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import json
import re
import time
from pathlib import Path

import jax
from context_parallel import _bytes_of

from halyard.shard import use_layout
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.plan import step_memory as memory_module
from halyard.train.run.setup import RunSetup
from halyard.train.run_config import TrainConfig

QUICK_MODEL = (
    "--model.hidden_size", "64", "--model.intermediate_size", "128", "--model.num_layers", "8",
    "--model.num_heads", "4", "--model.num_kv_heads", "2", "--model.head_dim", "16", "--model.vocab_size", "512",
    "--data.seq_len", "256",
)  # fmt: skip
WHILE = re.compile(r"while\(.*body=%?([\w.\-]+).*\"known_trip_count\":\{\"n\":\"(\d+)\"")
PERMUTE = re.compile(r"= (\w+\[[\d,]*\])(?:\{[^}]*\})? collective-permute\(")


def config_for(stages: int, repeats: int, microbatches: int, quick: bool) -> TrainConfig:
    arguments = [
        "--config", "llama-8b", "--trainer.batch_size", "64", "--trainer.accumulation", "1",
        "--trainer.mesh.stage", str(stages), "--trainer.mesh.fsdp", str(8 // stages), "--trainer.mesh.data", "1",
        "--model.pipeline_microbatches", str(microbatches), "--model.pipeline_repeats", str(repeats),
        *(QUICK_MODEL if quick else ()),
    ]  # fmt: skip
    return parse_config(TrainConfig, resolve_config_paths(arguments), prog="pipeline")


def computations(hlo: str) -> dict[str, list[str]]:
    """Compiled HLO text as computation name -> its lines."""
    blocks: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(1)
            blocks[name] = []
        elif name is not None:
            blocks[name].append(line)
    return blocks


def loop_permutes(hlo: str, iterations: int) -> tuple[int, int]:
    """(how many compiled loops run ``iterations`` times and pass data with collective permutes: the
    pipeline's forward and backward loops; the bytes those permutes send over all iterations)."""
    blocks = computations(hlo)
    loops, sent = 0, 0
    for lines in blocks.values():
        for line in lines:
            found = WHILE.search(line)
            if not found or int(found.group(2)) != iterations:
                continue
            permuted = sum(
                _bytes_of(m.group(1)) for m in map(PERMUTE.search, blocks.get(found.group(1), [])) if m
            )
            if permuted:
                loops += 1
                sent += permuted * iterations
    return loops, sent


def measure(stages: int, repeats: int, microbatches: int, quick: bool) -> dict:
    config = config_for(stages, repeats, microbatches, quick)
    devices = jax.devices()[:8]
    started = time.perf_counter()
    memory = memory_module.step_memory(config, devices)
    row = {
        "stages": stages,
        "repeats": repeats,
        "microbatches": microbatches,
        "params": memory.params,
        "optimizer_state": memory.optimizer_state,
        "activations": memory.activations,
        "total": memory.total,
    }
    if stages > 1:
        setup = RunSetup(config, devices=devices)
        abstract, shardings = setup.abstract_state
        state = memory_module._with_shardings(abstract, shardings)
        batch = memory_module._abstract_batch(config, setup)
        with use_layout(setup.layout, setup.mesh):
            hlo = setup.train_step().lower(state, batch, None).compile().as_text()
        iterations = repeats * microbatches + stages - 1
        loops, sent = loop_permutes(hlo, iterations)
        model = setup.model_config
        rows_per_microbatch = config.trainer.batch_size // microbatches // (8 // stages)  # fsdp splits them
        activation = rows_per_microbatch * config.data.seq_len * model.shape.embed * 4  # float32 on CPU
        row |= {
            "pipeline_loops": loops,  # the forward's and the backward's
            "bubble_compiled": round((iterations - repeats * microbatches) / iterations, 4)
            if loops == 2
            else None,
            "bubble_theory": round((stages - 1) / iterations, 4),
            "permute_bytes": sent,
            "activations_per_iteration": round(sent / (iterations * activation), 3),
        }
    row["compile_seconds"] = round(time.perf_counter() - started, 1)
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, S = 1 and 2")
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "pipeline.json"
    )
    args = parser.parse_args(argv)
    cases = [(1, 1, 8), (2, 1, 8), (2, 2, 8)] + ([] if args.quick else [(4, 1, 8), (8, 1, 8)])
    started = time.perf_counter()
    rows = [measure(*case, quick=args.quick) for case in cases]
    print(f"train step per device, {'tiny model' if args.quick else 'Llama 3.1 8B shape'}, 8 devices (GiB)")
    header = (
        "S",
        "R",
        "M",
        "params",
        "opt",
        "activ.",
        "total",
        "bubble",
        "theory",
        "permute MiB",
        "acts/iter",
    )
    print(" ".join(f"{name:>{9 if i > 2 else 2}}" for i, name in enumerate(header)))
    for row in rows:
        piped = "permute_bytes" in row
        cells = [row["stages"], row["repeats"], row["microbatches"]]
        cells += [f"{row[k] / 2**30:.2f}" for k in ("params", "optimizer_state", "activations", "total")]
        cells += [f"{row['bubble_compiled']:.3f}", f"{row['bubble_theory']:.3f}"] if piped else ["-", "-"]
        cells += (
            [f"{row['permute_bytes'] / 2**20:.1f}", f"{row['activations_per_iteration']:.2f}"]
            if piped
            else ["-", "-"]
        )
        print(" ".join(f"{cell:>{9 if i > 2 else 2}}" for i, cell in enumerate(cells)))
    pipelined = [row for row in rows if row["stages"] > 1]
    report = {
        "rows": rows,
        "worst_bubble_excess": max(abs(r["bubble_compiled"] - r["bubble_theory"]) for r in pipelined),
        "most_activations_per_iteration": max(r["activations_per_iteration"] for r in pipelined),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(
        f"compiled bubble - theory, worst: {report['worst_bubble_excess']:.4f}; "
        f"activations passed per iteration, most: {report['most_activations_per_iteration']:.2f}"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
