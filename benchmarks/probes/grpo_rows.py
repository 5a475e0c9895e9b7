"""The GRPO training phase alone, padded rows against packed ones: the loss and its gradients
(`halyard.train.rl.objective.grpo_loss_fn`) of one batch of sequences laid out by
`halyard.train.rl.packing.layout_rows`, with the training arithmetic (``rl.deterministic``: page-aligned
packing) and without it (packing at any token).

The sequences: ``--sequences`` completions of ``--prompt`` tokens (a range, drawn uniformly) and completions of
up to ``--completion`` tokens, drawn from ``--completion-range`` (a random model's completions run to the limit;
a trained one's end sooner). Reported per arm: the rows, the share of their tokens that are sequences, the
seconds of a step (median of ``--repeats``, wall and process CPU: on a shared machine the CPU seconds are the
steadier figure), completion tokens per second of each, and the log-probs' largest difference to the padded
arm of the same arithmetic (0 for the aligned packing: the bitwise promise).

Usage::

    python benchmarks/probes/grpo_rows.py                  # the llama benchmark shape (6 layers, hidden 512)
    python benchmarks/probes/grpo_rows.py --shape quick    # a tiny model (a smoke run)
    JAX_PLATFORMS=tpu python benchmarks/probes/grpo_rows.py --shape qwen-0.5b   # on the chip
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import init_model, model_config
from halyard.models.attention.dispatch import default_block_size
from halyard.train.rl.config import RlConfig
from halyard.train.rl.objective import completion_logprobs, grpo_loss_fn
from halyard.train.rl.packing import PackedSequence, RowLayout, alignment, layout_rows

SHAPES: dict[str, dict[str, Any]] = {
    "quick": dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2),
    "llama": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=6, num_heads=8, num_kv_heads=4),
    "qwen-0.5b": dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
        tie_embeddings=True, param_dtype="bfloat16",
    ),
}  # fmt: skip
"""Each ``--shape``: the model (benchmarks/rl/rl.py's shapes)."""
PAGE = 64


def sequences(
    count: int, prompt: tuple[int, int], completion: tuple[int, int], vocab: int
) -> list[PackedSequence]:
    rng = np.random.default_rng(0)
    drawn = []
    for _ in range(count):
        p, c = rng.integers(prompt[0], prompt[1] + 1), rng.integers(completion[0], completion[1] + 1)
        drawn.append(
            PackedSequence(list(rng.integers(1, vocab, p)), list(rng.integers(1, vocab, c)), [0.0] * int(c))
        )
    return drawn


def arm(
    model: Any, drawn: list[PackedSequence], layout: RowLayout, deterministic: bool, repeats: int
) -> dict[str, Any]:
    """Time the loss and gradients of ``drawn`` laid out by ``layout``."""
    advantages = np.linspace(-1.0, 1.0, len(drawn)).astype(np.float32)
    arrays = layout_rows(drawn, advantages, layout)
    batch = {name: jnp.asarray(value) for name, value in arrays.items()}
    config = RlConfig(max_new_tokens=layout.completion_tokens, deterministic=deterministic)
    loss_fn = grpo_loss_fn(config)
    step = jax.jit(jax.value_and_grad(lambda m, b: loss_fn(m, b, jax.random.key(0))[0]))
    jax.block_until_ready(step(model, batch))  # compiles
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(step(model, batch))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    rows = {k: batch[k] for k in ("tokens", "segment_ids", "positions", "label_index") if k in batch}
    logps = jax.jit(
        lambda m, r: completion_logprobs(m, r, temperature=1.0, top_p=1.0, invariant=deterministic)[0]
    )
    completion = int(arrays["completion_mask"].sum())
    rows_count, width = arrays["tokens"].shape
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    return {
        "rows": rows_count, "width": width, "row_fill": sum(s.length for s in drawn) / (rows_count * width),
        "step_seconds": wall, "step_cpu_seconds": cpu, "completion_tokens_per_second": completion / wall,
        "completion_tokens_per_cpu_second": completion / cpu,
        "logps": np.asarray(logps(model, rows)), "mask": arrays["completion_mask"] > 0,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--prompt", type=int, nargs=2, default=(8, 32), help="prompt tokens: least, most")
    parser.add_argument("--completion", type=int, default=64, help="rl.max_new_tokens")
    parser.add_argument(
        "--completion-range", type=int, nargs=2, default=None, help="drawn lengths (default 1..max)"
    )
    parser.add_argument("--pack-width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    model = init_model(
        model_config(
            "llama" if args.shape != "qwen-0.5b" else "qwen2", max_position=4096, **SHAPES[args.shape]
        ),
        jax.random.key(0),
    )
    low, high = args.completion_range or (1, args.completion)
    drawn = sequences(args.sequences, tuple(args.prompt), (low, high), SHAPES[args.shape]["vocab_size"])
    longest = -(-(args.prompt[1] + args.completion) // PAGE) * PAGE
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "jax": jax.__version__,
                               "backend": jax.default_backend(), "args": vars(args) | {"output": str(args.output)}}  # fmt: skip
    for deterministic in (True, False):
        mode = "deterministic" if deterministic else "fast"
        align = alignment(deterministic, PAGE, default_block_size())
        padded = RowLayout(longest + 1, longest=longest, completion_tokens=args.completion, packed=False)
        packed = RowLayout(
            args.pack_width + 1, longest=longest, completion_tokens=args.completion, align=align
        )
        base = arm(model, drawn, padded, deterministic, args.repeats)
        reference = base["logps"]
        for name, layout in (("padded", padded), ("packed", packed)):
            result = base if layout is padded else arm(model, drawn, layout, deterministic, args.repeats)
            mask = result.pop("mask")
            result["logp_difference_to_padded"] = float(np.abs(result.pop("logps") - reference)[mask].max())
            results[f"{name}_{mode}"] = result
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}
            print(f"{name}_{mode:14s}", json.dumps(shown), flush=True)
    for mode in ("deterministic", "fast"):
        results[f"packed_over_padded_{mode}"] = (
            results[f"packed_{mode}"]["completion_tokens_per_cpu_second"]
            / results[f"padded_{mode}"]["completion_tokens_per_cpu_second"]
        )
    print({k: round(v, 3) for k, v in results.items() if k.startswith("packed_over")})
    if args.output:
        args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
