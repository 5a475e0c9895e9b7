"""Where a served engine's programs go at a start: each program's trace, lowering, compile (or load from the
persistent compilation cache) and the steps themselves, cold (an empty cache) and warm (the cache the cold
start filled), each start in a fresh process (``serve_start_phases.py`` times the start's phases; this splits
its ``engine`` and ``first_request``).

In each start: the folder loaded as ``halyard serve --hf`` loads it, then ``engine`` (the `Engine` built),
``first_request`` (a greedy completion of ``--new-tokens`` from a 100-token prompt: its programs compiled or
loaded), ``steps_only`` (another prompt of the same length: the same programs, nothing to compile), then
``serial`` and ``threaded``: the next ``--more`` step shapes of the engine's warm-up set compiled one after
another, and as many again four at a time (`ModelRunner.compile_shapes`). JAX's own timers (`jax.monitoring`:
tracing, lowering to MLIR, the backend's compile, the cache's reads) are summed for each phase.

Usage::

    python benchmarks/probes/serve_program_load.py --size tpu --work /tmp/load     # on the TPU
    python benchmarks/probes/serve_program_load.py --size small                      # a CPU, seconds

Results: printed, and JSON (``--output``, default benchmarks/results/serve_program_load.json).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_program_load.json"


def start(folder: Path, cache: Path, new_tokens: int, more: int) -> dict[str, Any]:
    """One start's phases with JAX's timers inside each (this process must not have started JAX)."""
    import jax

    from halyard.serve import Engine, EngineConfig, SamplingParams
    from halyard.serve.server import load_hf_folder

    timers: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()

    def timed(event: str, seconds: float, **_: Any) -> None:
        timers[event.rsplit("/", 1)[-1]] += seconds

    def counted(event: str, **_: Any) -> None:
        counts[event.rsplit("/", 1)[-1]] += 1

    jax.monitoring.register_event_duration_secs_listener(timed)
    jax.monitoring.register_event_listener(counted)
    served = load_hf_folder(folder)
    jax.block_until_ready(served.model)
    results: dict[str, Any] = {}
    mark = time.perf_counter()

    def done(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        results[name] = dict(seconds=now - mark, jax_timers=dict(timers), jax_events=dict(counts))
        timers.clear()
        counts.clear()
        mark = now

    engine = Engine(served.model, EngineConfig(compilation_cache=str(cache)))
    done("engine")
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engine.generate([list(range(3, 103))], params)
    done("first_request")
    engine.generate([list(range(203, 303))], params)
    done("steps_only")
    runner = engine.runner
    todo = [shape for shape in runner.shape_set() if shape not in runner.compiled_shapes][: 2 * more]
    for _ in runner.compile_shapes(todo[:more], threads=1):
        pass
    done("serial")
    for _ in runner.compile_shapes(todo[more:], threads=4):
        pass
    done("threaded")
    results["shapes"] = [str(shape) for shape in todo]
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tpu", "small"), default="tpu")
    parser.add_argument("--work", type=Path, default=None, help="the model folder and the cache")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--more", type=int, default=4, help="shapes compiled serially, and as many threaded")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(start(Path(args.child[0]), Path(args.child[1]), args.new_tokens, args.more)))
        return {}
    work = args.work or Path(tempfile.mkdtemp(prefix="serve_load_"))
    folder = work / f"model-{args.size}"
    if not folder.exists():
        subprocess.run(  # in a process of its own: only one process can hold a TPU chip
            [sys.executable, "-c", f"import pathlib, serve_first_request as s; s.write_model(pathlib.Path({str(folder)!r}), {args.size!r})"],
            check=True, cwd=Path(__file__).resolve().parents[1] / "serving",
        )  # fmt: skip
    results: dict[str, Any] = {"size": args.size, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for name in ("cold", "warm"):
        child = [sys.executable, __file__, "--child", str(folder), str(work / "cache")]
        finished = subprocess.run(
            [*child, "--new-tokens", str(args.new_tokens), "--more", str(args.more)],
            capture_output=True,
            text=True,
        )
        if finished.returncode != 0:
            results[name] = {"error": finished.stderr[-2000:]}
            break
        results[name] = json.loads(finished.stdout.splitlines()[-1])
        for phase, value in results[name].items():
            if isinstance(value, dict):
                timers = "  ".join(
                    f"{k} {v:.2f}" for k, v in sorted(value["jax_timers"].items()) if v >= 0.01
                )
                print(
                    f"{name} {phase}: {value['seconds']:.2f} s ({timers}) {value['jax_events']}", flush=True
                )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
