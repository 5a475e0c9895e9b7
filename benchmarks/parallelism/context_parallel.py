"""Context parallelism: memory per device, collective bytes per layer and causal load balance.

Three measurements, all on the compiled programs (XLA's memory analysis and HLO; nothing runs at full
size, so a laptop's simulated CPU devices answer for a GPU pod's shapes):

- **Memory**: the trainer's own train step (`halyard plan`'s `step_memory`) on a Llama 3.2 1B shape at
  32k and 128k tokens a sequence (batch 1), on ``N`` = 1, 2, 4, 8 devices of a ``sequence`` axis, for
  each implementation. Activations per device should fall close to ``1/N``.
- **Collective bytes per layer**: one layer's attention, forward and backward, compiled alone on the
  sequence mesh; the bytes each device sends, read from the HLO's collectives, beside what the
  algorithm needs in theory (below).
- **Load balance**: the causal (query block, key block) pairs each device computes, in the natural order
  and in the load-balanced order (`halyard.models.context_order`), as max / min over devices.

Bytes a device sends, for every collective (the ring algorithms' volumes): a collective permute sends
its operand; an all-gather ``(N-1)`` times its operand; an all-to-all and a reduce-scatter ``(N-1)/N``
of their operand; an all-reduce ``2 (N-1)/N``. The attention runs in float32 here: XLA's CPU backend
converts bfloat16 operands of collectives to float32, which would double every figure against a GPU's.
With ``c`` one device's K (or V) chunk, ``q`` its query chunk and ``t`` one of its int32 token arrays
(positions and segment ids are sent; an all-true key-valid mask is folded away, except the ring's):

- ``ring``: K, V and the key tokens pass round ``N - 1`` times; the backward passes dK, dV ``N`` times
  (the last brings them home), and reuses the forward's chunks (XLA merges the backward's identical
  permutes with the forward's, keeping the chunks alive): ``(N-1)(2c + 2t) + 2Nc``;
- ``all_gather``: K, V and key tokens gathered, dK, dV reduce-scattered: ``(N-1)(2c + 2t) + (N-1) 2c``;
- ``ulysses``: q, k, v to heads and the output back, and in the backward their cotangents:
  ``(N-1)/N (4q + 4c)``, plus the token arrays gathered, ``(N-1) 2t``.

Usage::

    python benchmarks/parallelism/context_parallel.py            # Llama-1B shape, 32k and 128k tokens (minutes)
    python benchmarks/parallelism/context_parallel.py --quick    # a tiny model at 1024 tokens, N = 1, 2, 4 (a minute)

Results are printed and written as JSON (``--output``, default benchmarks/results/context_parallel.json).
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
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from halyard.models.attention import AttentionMask, attention
from halyard.models.context_order import causal_blocks_per_device, load_balanced_order
from halyard.named import Axis, NamedArray
from halyard.shard import Layout, MeshSpec, use_layout
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.plan.step_memory import step_memory
from halyard.train.run_config import TrainConfig

IMPLEMENTATIONS = ("ring", "all_gather", "ulysses")
QUICK_MODEL = (
    "--model.hidden_size", "128", "--model.intermediate_size", "256", "--model.num_layers", "2",
    "--model.num_heads", "8", "--model.num_kv_heads", "4", "--model.head_dim", "16",
    "--model.vocab_size", "512",
)  # fmt: skip
COLLECTIVE = re.compile(
    r"= (\([^)]*\)|\w+\[[\d,]*\](?:\{[^}]*\})?) (all-gather|all-to-all|collective-permute|reduce-scatter|all-reduce)\("
)
GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")
SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")


def config_for(seq: int, devices: int, implementation: str, quick: bool) -> TrainConfig:
    """The Llama-1B built-in config (or the quick tiny model) at ``seq`` tokens, batch 1, sequence ``devices``."""
    arguments = [
        "--config", "llama-1b", "--data.seq_len", str(seq), "--trainer.batch_size", "1",
        "--trainer.mesh.sequence", str(devices), "--trainer.mesh.fsdp", "1", "--trainer.mesh.data", "1",
        "--model.context_parallel", implementation, *(QUICK_MODEL if quick else ()),
    ]  # fmt: skip
    return parse_config(TrainConfig, resolve_config_paths(arguments), prog="context_parallel")


def memory_rows(seqs: list[int], sizes: list[int], quick: bool) -> list[dict]:
    """Per-device bytes of the compiled train step for each length, device count and implementation."""
    rows = []
    for seq in seqs:
        for size in sizes:
            for implementation in IMPLEMENTATIONS if size > 1 else ("none",):
                config = config_for(seq, size, "auto" if size == 1 else implementation, quick)
                memory = step_memory(config, jax.devices()[:size])
                rows.append(
                    {
                        "seq": seq,
                        "devices": size,
                        "implementation": implementation,
                        "activations": memory.activations,
                        "params": memory.params,
                        "optimizer_state": memory.optimizer_state,
                        "total": memory.total,
                        "compile_seconds": round(memory.compile_seconds, 1),
                    }
                )
    for row in rows:
        single = next(r for r in rows if r["seq"] == row["seq"] and r["devices"] == 1)
        row["activations_over_one_device"] = round(row["activations"] / single["activations"], 4)
    return rows


def _bytes_of(shape: str) -> int:
    sizes = {
        "f32": 4,
        "bf16": 2,
        "f16": 2,
        "s32": 4,
        "u32": 4,
        "pred": 1,
        "s8": 1,
        "u8": 1,
        "f64": 8,
        "s64": 8,
    }
    total = 0
    for dtype, dims in SHAPE.findall(shape):
        total += sizes[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return total


def sent_bytes(hlo: str) -> dict[str, int]:
    """Bytes each device sends, by collective kind, read from compiled HLO text (see the module docstring);
    a collective over groups of one device sends nothing."""
    sent: dict[str, int] = {}
    for line in hlo.splitlines():
        found = COLLECTIVE.search(line)
        if found is None:
            continue
        shape, kind = found.groups()
        groups = GROUPS.search(line)
        pairs = "source_target_pairs" in line
        size = len(groups.group(1).split(",")) if groups else 0
        if size < 2 and not pairs:
            continue
        result = _bytes_of(shape)
        volume = {
            "collective-permute": result,
            "all-gather": result * (size - 1) / max(size, 1),
            "all-to-all": result * (size - 1) / max(size, 1),
            "reduce-scatter": result * (size - 1),
            "all-reduce": 2 * result * (size - 1) / max(size, 1),
        }[kind]
        sent[kind] = sent.get(kind, 0) + int(volume)
    return sent


def theory_bytes(implementation: str, devices: int, chunk: dict[str, int]) -> int:
    """What ``implementation`` must send per device (module docstring); ``chunk``: one device's K chunk
    (``kv``), its query chunk (``q``) and one of its int32 token arrays (``tokens``)."""
    n, c, q, t = devices, chunk["kv"], chunk["q"], chunk["tokens"]
    tokens = 2 * t  # positions and segment ids (XLA drops an all-true key-valid mask, except the ring's)
    if implementation == "ring":
        return (n - 1) * (2 * c + tokens) + 2 * n * c
    if implementation == "all_gather":
        return (n - 1) * (2 * c + tokens) + (n - 1) * 2 * c
    return int((n - 1) / n * (4 * q + 4 * c)) + (n - 1) * tokens


def collective_rows(seq: int, sizes: list[int], shape: dict[str, int]) -> list[dict]:
    """One layer's attention (causal, packed segments, float32) forward and backward on ``sequence`` meshes."""
    batch, heads, kv_heads, head_size = 1, shape["heads"], shape["kv_heads"], shape["head_size"]
    rows = []
    for size in [s for s in sizes if s > 1]:
        mesh = MeshSpec(sequence=size, fsdp=1, data=1).build(jax.devices()[:size])
        for implementation in IMPLEMENTATIONS:
            if implementation == "ulysses" and kv_heads % size:
                rows.append({"devices": size, "implementation": implementation, "skipped": "kv heads"})
                continue
            hlo = _attention_hlo(mesh, implementation, batch, seq, heads, kv_heads, head_size)
            sent = sent_bytes(hlo)
            local = batch * seq // size
            chunk = {
                "kv": local * kv_heads * head_size * 4,
                "q": local * heads * head_size * 4,
                "tokens": local * 4,
            }
            theory = theory_bytes(implementation, size, chunk)
            measured = sum(sent.values())
            rows.append(
                {
                    "devices": size,
                    "implementation": implementation,
                    "measured_bytes": measured,
                    "theory_bytes": theory,
                    "measured_over_theory": round(measured / theory, 4),
                    "by_kind": sent,
                }
            )
    return rows


def _attention_hlo(
    mesh, implementation: str, batch: int, seq: int, heads: int, kv_heads: int, size: int
) -> str:  # type: ignore[no-untyped-def]
    def named(name: str, count: int, axis: str) -> NamedArray:
        axes = (Axis("batch", batch), Axis(axis, seq), Axis(name, count), Axis("head_size", size))
        sharding = NamedSharding(mesh, PartitionSpec(None, "sequence", None, None))
        return NamedArray(jax.ShapeDtypeStruct([a.size for a in axes], jnp.float32, sharding=sharding), axes)

    segments = NamedArray(
        jax.ShapeDtypeStruct(
            (batch, seq), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec(None, "sequence"))
        ),
        (Axis("batch", batch), Axis("pos", seq)),
    )

    def loss(query: NamedArray, key: NamedArray, value: NamedArray, segment_ids: NamedArray) -> jax.Array:
        mask = AttentionMask(causal=True, segment_ids=segment_ids)
        output = attention(query, key, value, mask, implementation="blocked", context_parallel=implementation)
        return jnp.sum(output.array.astype(jnp.float32))

    inputs = (
        named("heads", heads, "pos"),
        named("kv_heads", kv_heads, "key_pos"),
        named("kv_heads", kv_heads, "key_pos"),
    )
    with use_layout(Layout.fsdp(), mesh):
        lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*inputs, segments)
    return lowered.compile().as_text()


def balance_rows(seqs: list[int], sizes: list[int], block: int) -> list[dict]:
    """Causal block pairs per device, natural and load-balanced order, max / min over devices."""
    rows = []
    for seq in seqs:
        for size in [s for s in sizes if s > 1]:
            natural = causal_blocks_per_device(np.arange(seq), size, block)
            balanced = causal_blocks_per_device(load_balanced_order(seq, size), size, block)
            rows.append(
                {
                    "seq": seq,
                    "devices": size,
                    "natural_max_over_min": round(max(natural) / min(natural), 4),
                    "balanced_max_over_min": round(max(balanced) / min(balanced), 4),
                    "natural": natural,
                    "balanced": balanced,
                }
            )
    return rows


def _gib(size: float) -> str:
    return f"{size / 2**30:.2f}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument(
        "--devices", type=int, nargs="+", help="sequence sizes (default 1 2 4 8; quick: 1 2 4)"
    )
    parser.add_argument("--block", type=int, default=128, help="attention block of the balance count")
    parser.add_argument("--quick", action="store_true", help="a tiny model at 1024 tokens")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "results" / "context_parallel.json",
    )
    args = parser.parse_args(argv)
    seqs = [1024] if args.quick else args.seqs
    sizes = args.devices or ([1, 2, 4] if args.quick else [1, 2, 4, 8])
    started = time.perf_counter()
    shape = (
        {"heads": 8, "kv_heads": 4, "head_size": 16}
        if args.quick
        else {"heads": 32, "kv_heads": 8, "head_size": 64}
    )
    memory = memory_rows(seqs, sizes, args.quick)
    print(
        f"train step memory per device ({'tiny model' if args.quick else 'Llama 3.2 1B shape'}, batch 1; GiB)"
    )
    print(
        f"{'seq':>7} {'N':>2} {'implementation':<11} {'activations':>11} {'/ N=1':>7} {'1/N':>6} {'total':>8}"
    )
    for row in memory:
        print(
            f"{row['seq']:>7} {row['devices']:>2} {row['implementation']:<11} {_gib(row['activations']):>11} "
            f"{row['activations_over_one_device']:>7.3f} {1 / row['devices']:>6.3f} {_gib(row['total']):>8}"
        )
    collectives = collective_rows(seqs[0], sizes, shape)
    print(
        f"\ncollective bytes a device sends, one layer's attention forward + backward (seq {seqs[0]}, float32)"
    )
    print(f"{'N':>2} {'implementation':<11} {'measured MiB':>12} {'theory MiB':>11} {'ratio':>7}")
    for row in collectives:
        if "skipped" in row:
            print(f"{row['devices']:>2} {row['implementation']:<11} skipped: {row['skipped']} do not divide")
            continue
        print(
            f"{row['devices']:>2} {row['implementation']:<11} {row['measured_bytes'] / 2**20:>12.2f} "
            f"{row['theory_bytes'] / 2**20:>11.2f} {row['measured_over_theory']:>7.3f}"
        )
    balance = balance_rows(seqs, sizes, args.block)
    print(f"\ncausal block pairs per device, max / min (block {args.block})")
    for row in balance:
        print(
            f"seq {row['seq']:>7} N {row['devices']}: natural {row['natural_max_over_min']:.3f}, "
            f"load-balanced {row['balanced_max_over_min']:.3f}"
        )
    report = {
        "memory": memory,
        "collectives": collectives,
        "balance": balance,
        "worst_activation_excess": max(
            row["activations_over_one_device"] * row["devices"] for row in memory if row["devices"] > 1
        ),
        "worst_measured_over_theory": max(
            row["measured_over_theory"] for row in collectives if "measured_over_theory" in row
        ),
        "worst_balanced_max_over_min": max(row["balanced_max_over_min"] for row in balance),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(
        f"\nactivations x N / one device's, worst: {report['worst_activation_excess']:.3f} (1.0: exactly 1/N); "
        f"measured / theory bytes, worst: {report['worst_measured_over_theory']:.3f}; "
        f"load-balanced max/min, worst: {report['worst_balanced_max_over_min']:.3f}"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
