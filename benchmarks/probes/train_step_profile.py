"""Where a benchmark step spends its time: forward, forward+backward and the whole step, per config.

``--model gpt2|llama|llama-49k`` picks the shape (`benchmark_models.py`; default ``gpt2``).

For Halyard (the default config and any ``--variant NAME:FIELD=VALUE,...``) and plain JAX, three jitted
programs are timed in alternating rounds: the loss alone (``forward``), ``value_and_grad`` of the loss
(``grad``) and the trainer's full step (``step``: grad + clipping + AdamW). The backward pass is
``grad - forward`` and the optimizer ``step - grad``. With ``--hlo`` each optimized program's op counts
(fusions, dots, scatters, transposes, copies, while loops) are listed, to see what XLA made of it.
With ``--trace DIR`` one step of each config is traced with ``jax.profiler`` and the op time is split
into matmuls, copies/transposes, zero-fills and the rest (run with
``XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true`` so that XLA's CPU ops appear in the trace).

Usage::

    python benchmarks/probes/train_step_profile.py --variant full_logits:loss_block_size=none
    python benchmarks/probes/train_step_profile.py --quick --hlo
    python benchmarks/probes/train_step_profile.py --model llama-49k --variant full_logits:loss_full_logits_max_mib=1024
    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true python benchmarks/probes/train_step_profile.py --trace /tmp/trace

Results are printed and written as JSON (``--output``, default benchmarks/results/train_step_profile.json).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and baselines
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from benchmark_models import MODELS, BenchmarkModel
from train_step import make_halyard_step, parse_variant

from halyard.models import LmBatch

RESULTS = Path(__file__).resolve().parents[1] / "results" / "train_step_profile.json"
HLO_NAME = re.compile(r"^[a-z][a-z0-9_\-]*(\.[0-9]+)?$")  # an HLO instruction, not a runtime frame
OPS = (
    "fusion",
    "dot",
    "scatter",
    "gather",
    "transpose",
    "copy",
    "while",
    "reduce",
    "custom-call",
    "all-reduce",
)


def hlo_op_counts(compiled: Any) -> dict[str, int]:
    """Counts of interesting instructions in an optimized HLO module's text."""
    counts: collections.Counter[str] = collections.Counter()
    for line in compiled.as_text().splitlines():
        match = re.search(r"=\s*(?:\([^=]*?\)|\S+)\s+([a-z\-]+)\(", line)
        if match and match.group(1) in OPS:
            counts[match.group(1)] += 1
    return dict(sorted(counts.items()))


def op_time_shares(run_step: Callable[[], Any], directory: Path) -> dict[str, Any]:
    """Trace one call of ``run_step`` and split the time of XLA's leaf ops into categories (shares)."""
    jax.profiler.start_trace(str(directory), create_perfetto_trace=True)
    jax.block_until_ready(run_step())
    jax.profiler.stop_trace()
    files = sorted(glob.glob(str(directory / "**" / "*.trace.json.gz"), recursive=True))
    if not files:
        return {}
    with gzip.open(files[-1]) as handle:
        events = json.load(handle)
    events = events["traceEvents"] if isinstance(events, dict) else events
    seconds: collections.Counter[str] = collections.Counter()
    top: collections.Counter[str] = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or not HLO_NAME.match(name) or name.startswith(("while", "cond")):
            continue  # runtime frames and loops (their bodies' ops are counted themselves)
        if name.startswith(("ynn_fusion", "xnn_fusion", "dot", "onednn")):
            category = "matmul"
        elif name.startswith("wrapped_broadcast"):
            category = "zero_fill"
        elif "copy" in name or "transpose" in name:
            category = "copy_transpose"
        else:
            category = "elementwise_other"
        seconds[category] += event.get("dur", 0) / 1e6
        top[name] += event.get("dur", 0) / 1e6
    total = sum(seconds.values()) or 1.0
    return {
        "shares": {name: value / total for name, value in seconds.most_common()},
        "top_ops_seconds": dict(top.most_common(12)),
    }


def halyard_programs(
    model_spec: BenchmarkModel, shapes: Any, tokens: np.ndarray, overrides: dict[str, Any]
) -> dict[str, Callable]:
    config = model_spec.halyard_config(shapes, **overrides)
    model = config.init(jax.random.PRNGKey(0))
    batch = LmBatch.from_tokens(tokens)

    def loss(model: Any) -> jax.Array:
        value, _ = model.loss(batch, reduction="sum")
        return value

    step, state = make_halyard_step(model_spec, shapes, jax.random.PRNGKey(0), **overrides)
    return _programs(jax.jit(loss), jax.jit(jax.value_and_grad(loss)), model, step, state, {"tokens": tokens})


def plain_programs(model_spec: BenchmarkModel, shapes: Any, tokens: np.ndarray) -> dict[str, Callable]:
    step, state = model_spec.make_plain_step(shapes, jax.random.PRNGKey(0))
    params = state[0]
    loss = lambda p: model_spec.plain_loss(p, tokens, shapes)
    params_copy = jax.tree.map(lambda x: x.copy(), params)
    return _programs(jax.jit(loss), jax.jit(jax.value_and_grad(loss)), params_copy, step, state, tokens)


def _programs(forward: Any, grad: Any, params: Any, step: Any, state: Any, batch: Any) -> dict[str, Callable]:
    holder = {"state": state}

    def run_step() -> Any:
        holder["state"], output = step(holder["state"], batch)
        return output

    return {
        "forward": lambda: forward(params),
        "grad": lambda: grad(params),
        "step": run_step,
        "_compiled": lambda: {
            "forward": forward.lower(params).compile(),
            "grad": grad.lower(params).compile(),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2", help="the benchmark shape")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; quick 2)")
    parser.add_argument(
        "--variant", action="append", default=[], help="extra Halyard config NAME:FIELD=VALUE,..."
    )
    parser.add_argument("--no-default", action="store_true", help="skip Halyard's default config")
    parser.add_argument("--no-plain", action="store_true", help="skip plain JAX")
    parser.add_argument("--hlo", action="store_true", help="also count ops in the optimized HLO")
    parser.add_argument("--trace", type=Path, default=None, help="trace one step per config into this folder")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    model_spec = MODELS[args.model]
    shapes = model_spec.quick_shapes if args.quick else model_spec.shapes
    rounds = args.rounds or (2 if args.quick else 3)
    tokens = np.random.default_rng(0).integers(0, shapes.vocab_size, (shapes.batch_size, shapes.seq_len + 1))
    tokens = jax.numpy.asarray(tokens, jax.numpy.int32)

    configs: dict[str, dict[str, Callable]] = {}
    variants = ([] if args.no_default else [("halyard", {})]) + [parse_variant(v) for v in args.variant]
    for name, overrides in variants:
        configs[name] = halyard_programs(model_spec, shapes, tokens, overrides)
    if not args.no_plain:
        configs["plain_jax"] = plain_programs(model_spec, shapes, tokens)
    parts = ("forward", "grad", "step")
    for programs in configs.values():
        for part in parts:
            jax.block_until_ready(programs[part]())
    seconds: dict[str, dict[str, list[float]]] = {name: {p: [] for p in parts} for name in configs}
    for index in range(rounds):
        order = list(configs) if index % 2 == 0 else list(configs)[::-1]
        for name in order:
            for part in parts:
                start = time.perf_counter()
                jax.block_until_ready(configs[name][part]())
                seconds[name][part].append(time.perf_counter() - start)
    table = {}
    for name in configs:
        medians = {part: statistics.median(seconds[name][part]) for part in parts}
        medians["backward"] = medians["grad"] - medians["forward"]
        medians["optimizer"] = medians["step"] - medians["grad"]
        medians["grad_over_forward"] = medians["grad"] / medians["forward"]
        table[name] = medians
    hlo = {}
    if args.hlo:
        for name, programs in configs.items():
            hlo[name] = {part: hlo_op_counts(c) for part, c in programs["_compiled"]().items()}
    traces = {}
    if args.trace is not None:
        for name, programs in configs.items():
            traces[name] = op_time_shares(programs["step"], args.trace / name)
    print(f"shapes {asdict(shapes)}, {rounds} rounds (median seconds)")
    print(f"{'config':>18} {'forward':>8} {'backward':>9} {'optimizer':>10} {'step':>7} {'grad/fwd':>9}")
    for name, row in table.items():
        print(
            f"{name:>18} {row['forward']:8.3f} {row['backward']:9.3f} {row['optimizer']:10.3f} "
            f"{row['step']:7.3f} {row['grad_over_forward']:9.2f}"
        )
    for name, parts_counts in hlo.items():
        for part, counts in parts_counts.items():
            print(f"{name:>18} {part:>8} HLO: {counts}")
    for name, trace in traces.items():
        shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in trace.get("shares", {}).items())
        print(f"{name:>18} step op time: {shares or 'no XLA ops in the trace (set the XLA flag)'}")
    result = {
        "benchmark": "train_step_profile",
        "model": args.model,
        "op_time": traces,
        "shapes": asdict(shapes),
        "rounds": rounds,
        "variants": dict(variants),
        "medians": table,
        "seconds": seconds,
        "hlo_op_counts": hlo,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
