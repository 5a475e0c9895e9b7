"""Where a server's start goes: the phases `halyard serve --hf FOLDER` runs before it answers, each timed in a
fresh process (``serve_first_request.py`` times the whole start from outside; this splits it).

Phases, in order, each from the end of the one before: ``import`` (halyard.serve, jax), ``devices`` (the
accelerator's runtime starting: `jax.devices()`), ``load`` (the Hugging Face folder read as the server reads it,
`halyard.serve.server.load_hf_folder`, its weights on the device), ``engine`` (the `Engine` built, with
``--compilation-cache``), ``first_request`` (one completion of ``--new-tokens`` tokens, greedy: its programs
compiled or loaded from the cache), ``second_request``. Run twice, ``cold`` (an empty cache) and ``warm``.

Then ``overlapped``, a third start with the warm cache made as ``halyard serve --hf`` makes it: ``import_jax``,
then JAX's backend starting in a thread (`halyard.serve.server.backend.start_backend`) while ``import_rest``
(the server, the checkpoint readers) and ``load`` (the folder read into host memory, the wait for the backend,
the weights put on the device) run, then ``engine``, ``first_request`` and ``second_request``. Every start
reports ``to_first_answer``: its seconds from the first import to the first completion.

Usage::

    python benchmarks/probes/serve_start_phases.py --size tpu --work /tmp/phases     # on the TPU
    python benchmarks/probes/serve_start_phases.py --size small                        # a CPU, seconds

Results: printed, and JSON (``--output``, default benchmarks/results/serve_start_phases.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_start_phases.json"


def timer() -> tuple[dict[str, float], Callable[[str], None]]:
    """``(seconds, done)``: ``done(name)`` records the seconds since the last call (or since this one)."""
    seconds: dict[str, float] = {}
    mark = time.perf_counter()

    def done(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        seconds[name], mark = now - mark, now

    return seconds, done


def phases(folder: Path, cache: Path, new_tokens: int) -> dict[str, float]:
    """One start's phases, one after the other (this process must not have started JAX)."""
    seconds, done = timer()
    import jax

    import halyard.serve.server.app
    import halyard.serve.server.cli  # noqa: F401 (what the command imports: FastAPI, uvicorn)
    from halyard.serve import Engine, EngineConfig
    from halyard.serve.server import load_hf_folder

    done("import")
    jax.devices()
    done("devices")
    served = load_hf_folder(folder)  # as `halyard serve --hf` (--dtype auto: the folder's bfloat16)
    jax.block_until_ready(served.model)
    done("load")
    engine = Engine(served.model, EngineConfig(compilation_cache=str(cache)))
    done("engine")
    return requests(engine, new_tokens, seconds, done)


def overlapped(folder: Path, cache: Path, new_tokens: int) -> dict[str, float]:
    """One start as ``halyard serve --hf`` makes it: the backend starting while the rest is imported and the
    folder read (this process must not have started JAX)."""
    seconds, done = timer()
    import jax

    from halyard.serve.server.backend import start_backend
    from halyard.serve.server.host_transfer import size_host_buffer

    done("import_jax")
    size_host_buffer(folder)
    start_backend()
    import halyard.serve.server.app
    import halyard.serve.server.cli  # noqa: F401 (what the command imports: FastAPI, uvicorn)
    from halyard.serve import Engine, EngineConfig
    from halyard.serve.server import load_hf_folder

    done("import_rest")
    served = load_hf_folder(folder)  # waits for the backend once the folder is in host memory
    jax.block_until_ready(served.model)
    done("load")
    engine = Engine(served.model, EngineConfig(compilation_cache=str(cache)))
    done("engine")
    return requests(engine, new_tokens, seconds, done)


def requests(
    engine: Any, new_tokens: int, seconds: dict[str, float], done: Callable[[str], None]
) -> dict[str, float]:
    """Time two greedy completions of ``new_tokens`` tokens on ``engine``; ``seconds`` with them, the seconds to
    the first answer (``to_first_answer``) and the programs compiled."""
    from halyard.serve import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for name in ("first_request", "second_request"):
        engine.generate([list(range(3, 103))], params)
        done(name)
    seconds["to_first_answer"] = sum(v for k, v in seconds.items() if k != "second_request")
    seconds["programs_compiled"] = engine.stats.programs_compiled
    seconds["programs_loaded"] = engine.stats.programs_loaded
    seconds["programs_traced"] = engine.stats.programs_traced
    return seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tpu", "small"), default="tpu")
    parser.add_argument("--work", type=Path, default=None, help="the model folder and the cache")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=3, metavar=("FOLDER", "CACHE", "START"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        start = overlapped if args.child[2] == "overlapped" else phases
        print(json.dumps(start(Path(args.child[0]), Path(args.child[1]), args.new_tokens)))
        return {}
    work = args.work or Path(tempfile.mkdtemp(prefix="serve_phases_"))
    folder = work / f"model-{args.size}"
    subprocess.run(  # in a process of its own: only one process can hold a TPU chip
        [sys.executable, "-c", f"import pathlib, serve_first_request as s; s.write_model(pathlib.Path({str(folder)!r}), {args.size!r})"],
        check=True, cwd=Path(__file__).resolve().parents[1] / "serving",
    )  # fmt: skip
    results: dict[str, Any] = {"size": args.size, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # the cache: ours
    shutil.rmtree(work / "cache", ignore_errors=True)  # cold: an empty cache
    for start in ("cold", "warm", "overlapped"):
        child = [sys.executable, __file__, "--child", str(folder), str(work / "cache"), start]
        command = [*child, "--new-tokens", str(args.new_tokens)]
        done = subprocess.run(command, capture_output=True, text=True, env=environment)
        if done.returncode != 0:
            results[start] = {"error": done.stderr[-2000:]}
            break
        results[start] = json.loads(done.stdout.splitlines()[-1])
        print(start, "  ".join(f"{k} {v:.1f}" for k, v in results[start].items()), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
