"""Does deterministic mode keep its promise on this machine, and what does it cost? A verdict, for a TPU.

The promise (`halyard.serve.EngineConfig.deterministic`): a request's tokens and log-probs are bitwise the same
alone or among other requests, in any arrival order, with its prompt's pages from the prefix cache, and when
it is preempted and recomputed. The checks are those of packages/serve/tests/test_deterministic.py, run as a
benchmark: a target request (a 100-token prompt, 24 tokens at temperature 1 and top-p 0.9, seeded, with
log-probs) alone, then among 20 random others at a random place, after a request that caches its first page,
in a pool of 6 pages where it is preempted, among 64 and 1 others, (prefill chunks of 128) 7 and 63, and
(chunks of 24, ending inside the attention kernel's blocks) 20; then the row checks of the tests
(`halyard.serve.row_check`: every smaller program against the full-size one, random probes) over the
chunk-64 engine's program sizes, in this process's compiler settings (the suite compiles at -O0).
Fast mode's target among 20 others is compared too (it may differ: that is what the mode is for). The cost: the same 32
random requests in fast and in deterministic mode, each timed on its second run (the first compiles), the
ratio of their times (the goal on TPU: <= 1.3).

The model: Qwen2.5-0.5B's shape in bfloat16 (``--size tpu``) or a tiny Qwen2 (``--size small``, a CPU, seconds).
Each check ends the run when ``--limit`` seconds have passed since the start (the rest are skipped, and
the JSON says so).

Usage::

    python benchmarks/serving/serve_deterministic.py --size tpu
    python benchmarks/serving/serve_deterministic.py --size small

Results: printed (the last line is the verdict) and JSON (``--output``, default
benchmarks/results/serve_deterministic.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from serve_tpu import engine_config, make_model

from halyard.models import CausalLM
from halyard.serve import Engine, SampleOutput, SamplingParams
from halyard.serve.row_check import rows_agree

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_deterministic.json"
TARGET = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1234, logprobs=True)
COST_GOAL = 1.3


def config(chunk_size: int, num_pages: int = 160, deterministic: bool = True, warmup: bool = False) -> Any:
    """test_deterministic.py's engine: pages of 64, context 256, 64 rows, decoding programs of 32; ``warmup``:
    every step program compiled at the start, side by side (`EngineConfig.compile_threads`)."""
    return engine_config(
        page_size=64, num_pages=num_pages, max_context=256, max_running=64, chunk_size=chunk_size,
        max_prefill_rows=4, deterministic=deterministic, deterministic_rows=32, warmup=warmup,
    )  # fmt: skip


def others(count: int, seed: int, vocab: int) -> list[tuple[list[int], SamplingParams]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(0, vocab, int(rng.integers(1, 150))).tolist(),
            SamplingParams(
                max_tokens=int(rng.integers(1, 60)), temperature=float(rng.uniform(0, 1.5)), top_k=int(rng.integers(0, 50))
            ),
        )
        for _ in range(count)
    ]  # fmt: skip


def run_target(
    engine: Engine,
    prompt: list[int],
    among: list[tuple[list[int], SamplingParams]],
    position: int,
    cold: bool = True,
) -> SampleOutput:
    """The target's sample, run with ``among`` (it at ``position``), from an empty prefix cache if ``cold``."""
    if cold:
        engine.pages.clear_cache()
    requests = list(among)
    requests.insert(position, (prompt, TARGET))
    outputs = engine.generate([p for p, _ in requests], [s for _, s in requests])
    return outputs[position].samples[0]


def bits(values: list[float]) -> list[int]:
    """The float32 bit patterns of ``values`` (NaN equals NaN, -0.0 differs from 0.0: bit for bit)."""
    return np.asarray(values, np.float32).view(np.uint32).tolist()


def compare(sample: SampleOutput, alone: SampleOutput) -> dict[str, Any]:
    """Whether ``sample`` equals ``alone`` bit for bit (which of tokens, log-probs, sampled log-probs differ),
    and the largest log-prob difference over the leading tokens that agree."""
    agree = 0
    while (
        agree < min(len(sample.token_ids), len(alone.token_ids))
        and sample.token_ids[agree] == alone.token_ids[agree]
    ):
        agree += 1
    differ = [
        name
        for name, ours, theirs in (
            ("tokens", sample.token_ids, alone.token_ids),
            ("logprobs", bits(sample.logprobs), bits(alone.logprobs)),
            ("sampled_logprobs", bits(sample.sampled_logprobs), bits(alone.sampled_logprobs)),
        )
        if ours != theirs
    ]
    gap = np.abs(np.float32(sample.logprobs[:agree]) - np.float32(alone.logprobs[:agree]))
    return dict(bitwise=not differ, differ=differ, tokens_agreeing=agree, max_logprob_difference=float(np.nanmax(gap)) if agree else 0.0)  # fmt: skip


def timed_workload(engine: Engine, requests: list[tuple[list[int], int]]) -> float:
    """Seconds to run ``requests`` (greedy, every one to its ``max_tokens``) from an empty prefix cache."""
    engine.pages.clear_cache()
    started = time.perf_counter()
    engine.generate(
        [p for p, _ in requests],
        [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests],
    )
    return time.perf_counter() - started


def checks(
    model: CausalLM, vocab: int, warmup: bool
) -> list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]]:
    """The checks in order, each a function of the state so far (engines, the target alone) to its result."""
    prompt = np.random.default_rng(0).integers(0, vocab, 100).tolist()

    def engine(state: dict[str, Any], chunk: int) -> Engine:
        """The deterministic engine of prefill chunks of ``chunk`` tokens (built at first use)."""
        engines = state.setdefault("engines", {})
        if chunk not in engines:
            engines[chunk] = Engine(model, config(chunk, warmup=warmup))
        return engines[chunk]

    def alone(state: dict[str, Any]) -> dict[str, Any]:
        state["alone"] = run_target(engine(state, 64), prompt, [], 0)
        return dict(tokens=len(state["alone"].token_ids))

    def among(count: int, chunk: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def check(state: dict[str, Any]) -> dict[str, Any]:
            position = int(np.random.default_rng(count).integers(0, count + 1))
            return compare(
                run_target(engine(state, chunk), prompt, others(count, count, vocab), position),
                state["alone"],
            )

        return check

    def cache_hit(state: dict[str, Any]) -> dict[str, Any]:
        cached = engine(state, 64)
        cached.pages.clear_cache()
        cached.generate([prompt[:90] + [7] * 20], SamplingParams(max_tokens=1))  # caches the first page
        hit = bool(cached.pages.cached_prefix(prompt))
        return dict(
            compare(run_target(cached, prompt, others(5, 99, vocab), 3, cold=False), state["alone"]),
            cache_hit=hit,
        )

    def preempted(state: dict[str, Any]) -> dict[str, Any]:
        small = Engine(model, config(64, num_pages=6, warmup=warmup))
        result = compare(run_target(small, prompt, others(6, 5, vocab), 4), state["alone"])
        return dict(result, preemptions=small.stats.preemptions)

    def row_checks(state: dict[str, Any]) -> dict[str, Any]:
        """`halyard.serve.row_check` over every program size of the chunk-64 engine below the most (at the
        target's page bucket): each gives every probed sequence the full-size program's bits."""
        runner = engine(state, 64).runner
        agree = {
            str(tokens): rows_agree(runner, runner.shape_for(tokens, 4)) for tokens in runner.token_sizes[:-1]
        }
        return dict(bitwise=all(agree.values()), sizes=agree)

    def fast_mode(state: dict[str, Any]) -> dict[str, Any]:
        state["fast"] = Engine(model, config(64, deterministic=False, warmup=warmup))
        fast_alone = run_target(state["fast"], prompt, [], 0)
        return dict(
            compare(run_target(state["fast"], prompt, others(20, 20, vocab), 7), fast_alone), informative=True
        )

    def cost(state: dict[str, Any]) -> dict[str, Any]:
        rng = np.random.default_rng(3)
        requests = [
            (rng.integers(0, vocab, int(rng.integers(16, 129))).tolist(), int(rng.integers(16, 65)))
            for _ in range(32)
        ]
        fast, deterministic = (
            state.get("fast") or Engine(model, config(64, deterministic=False, warmup=warmup)),
            engine(state, 64),
        )
        first = {
            "fast": timed_workload(fast, requests),
            "deterministic": timed_workload(deterministic, requests),
        }
        second_run = {
            "fast": timed_workload(fast, requests),
            "deterministic": timed_workload(deterministic, requests),
        }
        ratio = second_run["deterministic"] / second_run["fast"]
        return dict(
            first_run_seconds=first,
            second_run_seconds=second_run,
            deterministic_over_fast=ratio,
            goal=COST_GOAL,
            met=ratio <= COST_GOAL,
        )

    def among_check(count: int, chunk: int) -> tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return f"among_{count}_chunk_{chunk}", among(count, chunk)

    # The most telling first (a cut-off run keeps them); the engine of chunks of 128 compiles its own programs.
    return [
        ("alone", alone), among_check(20, 64), ("cost", cost), ("prefix_cache_hit", cache_hit),
        ("preempted", preempted), among_check(64, 64), among_check(1, 64), ("fast_mode_among_20", fast_mode),
        among_check(7, 128), among_check(63, 128), among_check(20, 24), ("row_checks", row_checks),
    ]  # fmt: skip


def verdict(results: dict[str, Any]) -> str:
    """One line: whether every deterministic check was bitwise, which were not, which did not run."""
    promised = [
        name
        for name in results["checks"]
        if name.startswith(("among_", "prefix_", "preempted", "row_checks"))
    ]
    broken = [name for name in promised if not results["checks"][name].get("bitwise")]
    if not promised:
        line = "deterministic mode NOT MEASURED"
    elif broken:
        line = f"deterministic mode BROKEN in: {', '.join(broken)}"
    else:
        line = "deterministic mode holds"
    line += f" ({len(promised) - len(broken)} of {len(promised)} checks bitwise"
    if results["skipped"]:
        line += f"; not run (time limit): {', '.join(results['skipped'])}"
    cost = results["checks"].get("cost")
    if cost:
        line += f"; cost {cost['deterministic_over_fast']:.2f}x fast mode, goal <= {COST_GOAL}"
    return line + ")"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tpu", "small"), default="tpu")
    parser.add_argument("--dtype", default="bfloat16", help="the parameters' dtype (model.param_dtype)")
    parser.add_argument("--limit", type=float, default=240.0, help="no check starts after this many seconds")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--warmup", action=argparse.BooleanOptionalAction, default=None,
        help="compile each engine's step programs at its start, side by side (default: with --size tpu)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="+", default=None, help="run these checks alone (after `alone`)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    warmup = args.size == "tpu" if args.warmup is None else args.warmup
    started = time.perf_counter()
    model = make_model(args.size, args.dtype)
    vocab = model.unembedding.axis_size("vocab")
    results: dict[str, Any] = dict(
        size=args.size, dtype=args.dtype, warmup=warmup, backend=jax.default_backend(), jax=jax.__version__, checks={}, skipped=[],
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )  # fmt: skip
    state: dict[str, Any] = {}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for name, check in checks(model, vocab, warmup):
        if args.only is not None and name not in (*args.only, "alone"):
            results.setdefault("not_asked", []).append(name)
            continue
        if time.perf_counter() - started > args.limit or (name != "alone" and "alone" not in state):
            results["skipped"].append(name)
            continue
        began = time.perf_counter()
        results["checks"][name] = dict(check(state), seconds=time.perf_counter() - began)
        print(name, json.dumps(results["checks"][name]), flush=True)
        args.output.write_text(json.dumps(results, indent=1))
    results["verdict"] = verdict(results)
    args.output.write_text(json.dumps(results, indent=1))
    print(results["verdict"])
    return results


if __name__ == "__main__":
    main()
