"""What the engine compiles on `benchmarks/serving/serve.py --quick`'s workload: each engine arm's XLA compiles and
their seconds at start and in its first and second runs, counted by a `jax.monitoring` listener on XLA's
backend compiles (so it counts on any checkout, whatever the engine counts itself). The arms run in one
process, in order: a later arm reuses the programs an earlier one compiled.

Usage::

    python benchmarks/probes/serve_compiles.py            # each program compiled at first use
    python benchmarks/probes/serve_compiles.py --warmup   # every shape compiled at start (EngineConfig.warmup)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and baselines
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
import serve
from benchmark_models import QUICK_LLAMA, llama_config

from halyard.models import init_model
from halyard.serve import Engine, EngineConfig

_COMPILED: list[float] = []


def _record(event: str, duration_secs: float, **_: str | int) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILED.append(duration_secs)


def _since(mark: int) -> str:
    return f"{len(_COMPILED) - mark} compiles, {sum(_COMPILED[mark:]):.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--warmup", action="store_true", help="EngineConfig.warmup: compile every shape at start"
    )
    args = parser.parse_args()
    jax.monitoring.register_event_duration_secs_listener(_record)
    shapes = replace(QUICK_LLAMA, seq_len=128)
    workload = serve.Workload.make(16, shapes.vocab_size, (4, 40), (4, 24), static_batch=8)
    context = shapes.seq_len
    model = init_model(llama_config(shapes), jax.random.key(0))
    extra = {"warmup": True} if args.warmup else {}
    for name, fields in serve.ENGINE_MODES.items():
        mark = len(_COMPILED)
        started = time.perf_counter()
        engine = Engine(
            model,
            EngineConfig(
                page_size=64, num_pages=64 * -(-context // 64) + 8, max_context=context, max_running=64,
                chunk_size=128, max_prefill_rows=4, **fields, **extra,
            ),
        )  # fmt: skip
        line = f"{name}: start {time.perf_counter() - started:.1f} s ({_since(mark)})"
        mark = len(_COMPILED)
        first = serve.run_workload(engine, workload)["seconds"]
        line += f"; first run {first:.1f} s ({_since(mark)})"
        mark = len(_COMPILED)
        serve.run_workload(engine, workload)
        print(
            f"{line}; second run ({_since(mark)}); step shapes {len(engine.runner.compiled_shapes)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
