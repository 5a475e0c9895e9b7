"""The engine's host CPU time per decode step: the main thread's work beside the device's (issue 53).

A tiny Qwen2 (2 layers, hidden 64, so the device's compute is next to nothing) runs in an engine of the TPU
profile's sizes (benchmarks/serving/serve_tpu.py: pages of 256 tokens, contexts up to 1536, 128 rows): ``--rows``
requests of ``--prompt`` random tokens are prefilled, then ``--steps`` steps in which every row decodes are
timed, each by the main thread's CPU time (`time.thread_time`: what the host computes while the chip runs the
step before; XLA's CPU threads are not counted) and its wall time, with the CPU time Python's garbage collector
took in them (a full collection now and then costs far more than a step: the median leaves it out, the mean
does not). ``--gc-freeze`` moves every object alive once the engine is ready out of the collector's sight
(`gc.freeze`, what a server can do after its start). ``--profile`` adds a cProfile of the timed steps, by CPU
time, its top functions printed (and the stats saved with ``--profile-output``).

Usage::

    python benchmarks/probes/serve_host_step.py                      # 128 rows, 40 steps
    python benchmarks/probes/serve_host_step.py --profile --top 30   # where the time goes
    python benchmarks/probes/serve_host_step.py --gc-freeze          # the collector's old objects frozen
    python benchmarks/probes/serve_host_step.py --rows 8 --prompt 16 --steps 4 --page-size 8   # smoke size

Results: printed, and JSON (``--output``, default benchmarks/results/serve_host_step.json).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from halyard.models import CausalLM, init_model, model_config
from halyard.serve import Engine, EngineConfig, SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_host_step.json"


def tiny_model(max_position: int) -> CausalLM:
    """A random two-layer Qwen2 of hidden size 64 (the device's part of a step is negligible)."""
    config = model_config(
        "qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, max_position=max_position, param_dtype="float32", tie_embeddings=True,
    )  # fmt: skip
    return init_model(config, jax.random.key(0))


class CollectorClock:
    """The main thread's CPU time in Python's garbage collections since `reset`."""

    def __init__(self) -> None:
        self.seconds, self._started = 0.0, 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started

    def reset(self) -> None:
        self.seconds = 0.0


def decode_steps(
    engine: Engine, rows: int, prompt: int, steps: int, profiler: cProfile.Profile | None
) -> tuple[list[float], list[float], list[float]]:
    """Prefill ``rows`` requests of ``prompt`` tokens, then time ``steps`` steps in which all of them decode:
    ``(main-thread CPU seconds, wall seconds, CPU seconds in garbage collection)`` per step (``profiler`` on
    during those steps)."""
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=engine.config.max_context - prompt, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(rng.integers(0, 512, prompt).tolist(), params) for _ in range(rows)]
    drawn = dict.fromkeys(ids, 0)
    cpu: list[float] = []
    wall: list[float] = []
    collected: list[float] = []
    collector = CollectorClock()
    while len(cpu) < steps:
        decoding = all(count > 0 for count in drawn.values())
        if decoding and profiler is not None:
            profiler.enable()
        collector.reset()
        started, started_cpu = time.perf_counter(), time.thread_time()
        updates = engine.step()
        spent_cpu, spent = time.thread_time() - started_cpu, time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
        for update in updates:
            drawn[update.request_id] += len(update.token_ids)
        if decoding and len(updates) == rows:
            cpu.append(spent_cpu)
            wall.append(spent)
            collected.append(collector.seconds)
    for request in ids:
        engine.cancel(request)
    while engine.has_work:
        engine.step()
    return cpu, wall, collected


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128, help="decoding rows (max_running and min_rows)")
    parser.add_argument("--prompt", type=int, default=512, help="each request's prompt tokens")
    parser.add_argument("--steps", type=int, default=40, help="decode steps timed")
    parser.add_argument("--page-size", type=int, default=256, help="tokens a page")
    parser.add_argument("--max-context", type=int, default=1536, help="the engine's context")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() once the engine is ready")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed steps (CPU time)")
    parser.add_argument("--top", type=int, default=25, help="functions of the profile printed")
    parser.add_argument("--profile-output", type=Path, default=None, help="save the cProfile stats here")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    pages_per_row = -(-args.max_context // args.page_size)
    config = EngineConfig(
        page_size=args.page_size, num_pages=args.rows * pages_per_row + 16, max_context=args.max_context,
        max_running=args.rows, chunk_size=args.page_size, max_prefill_rows=4, min_rows=args.rows, warmup=False,
    )  # fmt: skip
    engine = Engine(tiny_model(args.max_context), config)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    profiler = cProfile.Profile(time.thread_time) if args.profile else None
    cpu, wall, collected = decode_steps(engine, args.rows, args.prompt, args.steps, profiler)
    results = dict(
        rows=args.rows, prompt=args.prompt, page_size=args.page_size, steps=len(cpu), gc_freeze=args.gc_freeze,
        host_cpu_seconds_median=statistics.median(cpu), host_cpu_seconds_mean=statistics.fmean(cpu),
        wall_seconds_median=statistics.median(wall), gc_seconds_mean=statistics.fmean(collected),
        host_cpu_seconds=cpu, gc_seconds=collected, backend=jax.default_backend(),
    )  # fmt: skip
    print(
        f"{args.rows} rows: host CPU per decode step {1e3 * results['host_cpu_seconds_median']:.2f} ms "
        f"(median of {len(cpu)}; mean {1e3 * results['host_cpu_seconds_mean']:.2f} ms, of which garbage "
        f"collection {1e3 * results['gc_seconds_mean']:.2f} ms), wall {1e3 * results['wall_seconds_median']:.2f} ms"
    )
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())
        if args.profile_output is not None:
            profiler.dump_stats(args.profile_output)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
