"""Speculative decoding (``EngineConfig.speculative``) against plain decoding, on a workload that repeats.

The model: the ``llama`` benchmark shape of serve.py (6 layers, hidden 512, vocab 8192), randomly
initialized (``--quick``: the tiny shape; ``--tpu``: Qwen2.5-0.5B's shape in bfloat16, serve_tpu.py's, for
the chip). The workload, "an edit of a text": each request's prompt is a
random segment written twice, greedy, ``--new-tokens`` new tokens (``ignore_eos``); a random model's
greedy continuation falls into cycles, which prompt lookup proposes as a model trained on edits would
propose the text it copies. Arms: ``none``; ``ngram`` (prompt lookup); ``draft`` (the same model as its own
draft: an upper bound on a draft's acceptance, at a draft's full cost) with ``--draft``. Each arm runs the
workload once to compile, then ``--repeats`` times, the arms interleaved; reported: the median run's output
tokens/s, the speculative arms' ratio to ``none``, and the share of proposals accepted. The arms' tokens
are checked equal (speculation changes no token).

Usage::

    python benchmarks/serving/serve_speculative.py                       # 1 request, the llama shape
    python benchmarks/serving/serve_speculative.py --requests 4 --draft
    python benchmarks/serving/serve_speculative.py --quick --repeats 1   # a smoke test (seconds)
    python3 benchmarks/serving/serve_speculative.py --tpu --requests 8 --draft   # on the chip
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_tpu.py (--tpu)
import cpu_machine
from benchmark_models import QUICK_LLAMA, llama_config
from llama_baselines import LlamaShapes

from halyard.models import init_model
from halyard.serve import Engine, EngineConfig, SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_speculative.json"


def run(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    """Seconds to run ``prompts`` to their end from an empty prefix cache, and their tokens."""
    engine.pages.clear_cache()
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = engine.generate(prompts, params)
    return time.perf_counter() - started, [o.samples[0].token_ids for o in outputs]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model (a smoke test)")
    parser.add_argument("--tpu", action="store_true", help="Qwen2.5-0.5B's shape in bfloat16 (for the chip)")
    parser.add_argument("--requests", type=int, default=1, help="requests running together (default 1)")
    parser.add_argument("--segment", type=int, default=96, help="prompt tokens written twice (default 96)")
    parser.add_argument(
        "--new-tokens", type=int, default=192, help="tokens generated per request (default 192)"
    )
    parser.add_argument("--tokens", type=int, default=6, help="speculative tokens a step (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per arm (median reported)")
    parser.add_argument("--draft", action="store_true", help="add the draft arm (the model as its own draft)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    shapes = replace(QUICK_LLAMA if args.quick else LlamaShapes(), seq_len=512)
    if args.tpu:
        import serve_tpu

        model = serve_tpu.make_model("tpu")
    else:
        model = init_model(llama_config(shapes), jax.random.key(0))
    vocab = model.unembedding.axis_size("vocab")
    rng = np.random.default_rng(0)
    prompts = [2 * rng.integers(0, vocab, args.segment).tolist() for _ in range(args.requests)]
    sizes = dict(
        page_size=64, num_pages=8 * args.requests + 8, max_context=512, max_running=max(8, args.requests)
    )
    arms = {"none": {}, "ngram": {"speculative": "ngram"}}
    if args.draft:
        arms["draft"] = {"speculative": "draft"}
    engines = {
        name: Engine(
            model,
            EngineConfig(**sizes, **fields, speculative_tokens=args.tokens),
            draft=model if name == "draft" else None,
        )
        for name, fields in arms.items()
    }
    expected = run(engines["none"], prompts, args.new_tokens)[1]
    for name, engine in engines.items():  # compile
        assert run(engine, prompts, args.new_tokens)[1] == expected, (
            f"{name}: other tokens than without speculation"
        )
    before = {name: (e.stats.tokens_proposed, e.stats.tokens_accepted) for name, e in engines.items()}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            seconds[name].append(run(engine, prompts, args.new_tokens)[0])
    generated = args.requests * args.new_tokens
    results: dict[str, Any] = {
        "machine": cpu_machine.describe(),
        "model": "Qwen2.5-0.5B shape, bfloat16" if args.tpu else shapes.__dict__,
        "requests": args.requests,
        "segment": args.segment,
        "new_tokens": args.new_tokens,
        "speculative_tokens": args.tokens,
        "arms": {},
    }
    for name, engine in engines.items():
        median = statistics.median(seconds[name])
        proposed = engine.stats.tokens_proposed - before[name][0]
        accepted = engine.stats.tokens_accepted - before[name][1]
        results["arms"][name] = dict(
            seconds=seconds[name],
            tokens_per_second=generated / median,
            speedup=statistics.median(seconds["none"]) / median,
            accepted_share=accepted / proposed if proposed else None,
        )
        print(
            f"{name:6s} {generated / median:8.1f} output tokens/s  {statistics.median(seconds['none']) / median:5.2f}x"
            + (
                f"  {accepted / proposed:.0%} of {proposed // args.repeats} proposals a run kept"
                if proposed
                else ""
            )
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
