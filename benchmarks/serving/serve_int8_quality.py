"""What int8 weights cost in quality (issue 69): a trained run's checkpoint served by the engine in bfloat16
and with ``quantization="int8"`` (its projections int8 from the bfloat16 weights, activations in bfloat16), on
held-out text; float32 beside them shows how far bfloat16 itself is from the trained weights.

Held-out text: Python standard-library files outside the 800 that ``data.max_documents: 800`` trains on (the
demo's 400 are among those), cut into windows of ``--window`` tokens. Figures per arm against bfloat16:
perplexity (from the engine's prompt log-probs over the windows) and its ratio, the mean and largest
per-token log-prob difference, and greedy agreement: ``--prompts`` prompts (a window's first 32 tokens)
continued ``--tokens`` tokens greedily, the share of tokens before the first divergence and the share of
continuations that are identical.

    XLA_FLAGS= .venv/bin/halyard train --config demo          # runs/demo, a few minutes
    python3 benchmarks/serving/serve_int8_quality.py --run runs/demo
    # the wider run of benchmarks/results/serve_int8_quality_demo-wide_*.json (about 15 minutes):
    XLA_FLAGS= .venv/bin/halyard train --config demo --trainer.run_dir runs/demo-wide --model.hidden_size 192 \
        --model.intermediate_size 512 --trainer.steps 400 --data.max_documents 800 --trainer.eval_every 200
    python3 benchmarks/serving/serve_int8_quality.py --run runs/demo-wide
    python3 benchmarks/serving/serve_int8_quality.py --quick           # a tiny random model, seconds (a test runs it)

JSON: ``--output`` (default benchmarks/results/serve_int8_quality_<run name>_<date>.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import CausalLM, init_model, model_config
from halyard.models.model import cast_floating
from halyard.serve import Engine, EngineConfig, SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results"
TRAINED_DOCUMENTS = 800
"""Held-out files are those outside ``stdlib_source_files(TRAINED_DOCUMENTS)`` (which holds every smaller
selection: its spacing halves the demo's 400)."""
PROMPT_TOKENS = 32


def held_out_windows(encode: Any, window: int, count: int) -> list[list[int]]:
    """``count`` windows of ``window`` tokens from standard-library files no run of up to 800 documents saw."""
    from halyard.train.corpora.python_stdlib import stdlib_source_files

    trained = set(stdlib_source_files(TRAINED_DOCUMENTS))
    held = [path for path in stdlib_source_files() if path not in trained]
    windows: list[list[int]] = []
    for path in held[:: max(1, len(held) // (4 * count))]:
        ids = encode(path.read_text(encoding="utf-8", errors="replace"))
        windows += [ids[i : i + window] for i in range(0, len(ids) - window + 1, window)][:2]
        if len(windows) >= count:
            break
    return windows[:count]


def engine_for(model: CausalLM, quantization: str, rows: int, context: int) -> Engine:
    """An engine of ``rows`` rows, one window's prompt in one chunk, two programs per variant (decoding rows,
    and the most a step holds)."""
    config = EngineConfig.sized_for(
        sequences=rows, context=context, quantization=quantization, chunk_size=context, max_prefill_rows=2,
        token_buckets=(rows,),
    )  # fmt: skip
    return Engine(model, config)


def prompt_logprobs(engine: Engine, windows: list[list[int]]) -> np.ndarray:
    """``[windows, window - 1]``: every token's log-prob after the first."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=True)
    outputs = engine.generate(windows, params)
    return np.asarray([output.prompt_logprobs[1:] for output in outputs], np.float64)  # type: ignore[index]


def greedy(engine: Engine, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    return [output.samples[0].token_ids for output in engine.generate(prompts, params)]


def compare(arm: dict[str, Any], reference: dict[str, Any], tokens: int) -> dict[str, Any]:
    """``arm``'s figures against ``reference``'s (bfloat16)."""
    difference = np.abs(arm["logprobs"] - reference["logprobs"])
    prefixes = []
    for mine, theirs in zip(arm["greedy"], reference["greedy"]):
        same = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), tokens)
        prefixes.append(same)
    return {
        "perplexity": arm["perplexity"],
        "perplexity_ratio_to_bfloat16": arm["perplexity"] / reference["perplexity"],
        "logprob_difference_mean": float(difference.mean()),
        "logprob_difference_max": float(difference.max()),
        "greedy_tokens_before_divergence": float(np.mean(prefixes) / tokens),
        "greedy_identical_continuations": float(np.mean([p == tokens for p in prefixes])),
    }


def measure(
    model: CausalLM, windows: list[list[int]], prompts: int, tokens: int, rows: int, names: list[str]
) -> dict[str, Any]:
    """The figures of the arms ``names`` (of float32, bfloat16, int8; bfloat16 always runs)."""
    starts = [window[:PROMPT_TOKENS] for window in windows[:prompts]]
    context = max(len(windows[0]), PROMPT_TOKENS + tokens) + 1
    bfloat16 = cast_floating(model, jnp.bfloat16)
    arms = {"float32": (model, "none"), "bfloat16": (bfloat16, "none"), "int8": (bfloat16, "int8")}
    measured: dict[str, dict[str, Any]] = {}
    for name, (weights, quantization) in arms.items():
        if name not in names and name != "bfloat16":
            continue
        began = time.perf_counter()
        engine = engine_for(weights, quantization, rows, context)
        logprobs = prompt_logprobs(engine, windows)
        measured[name] = {
            "logprobs": logprobs,
            "perplexity": float(np.exp(-logprobs.mean())),
            "greedy": greedy(engine, starts, tokens),
            "seconds": time.perf_counter() - began,
        }
        print(
            f"{name}: perplexity {measured[name]['perplexity']:.4f} ({measured[name]['seconds']:.0f} s)",
            flush=True,
        )
    return {
        name: dict(compare(arm, measured["bfloat16"], tokens), seconds=arm["seconds"])
        for name, arm in measured.items()
    }


def run_model(run: Path) -> tuple[CausalLM, Any, str]:
    """The run's latest checkpoint (on the host), its tokenizer's encode, the run's name."""
    from halyard.train.data_assembly.tokenizer import load_run_tokenizer
    from halyard.train.run.loading import load_run_model

    loaded = load_run_model(run, None)
    tokenizer = load_run_tokenizer(loaded.tokenizer)
    return jax.device_get(loaded.model), lambda text: tokenizer.encode(text).ids, run.resolve().name


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a training run folder (trainer.run_dir)")
    parser.add_argument("--quick", action="store_true", help="a tiny random model on random tokens (a test)")
    parser.add_argument("--windows", type=int, default=64, help="held-out windows (default: 64)")
    parser.add_argument("--window", type=int, default=128, help="tokens per window (default: 128)")
    parser.add_argument("--prompts", type=int, default=32, help="greedy prompts (default: 32)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt (default: 32)")
    parser.add_argument("--rows", type=int, default=16, help="the engines' running rows (default: 16)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick == (args.run is not None):
        parser.error("give --run RUN or --quick")
    if args.quick:
        config = model_config("llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                              num_heads=4, num_kv_heads=2, max_position=128)  # fmt: skip
        model, name = init_model(config, jax.random.key(0)), "quick"
        rng = np.random.default_rng(0)
        windows = [[int(t) for t in rng.integers(0, 256, 48)] for _ in range(4)]
        args.prompts, args.tokens, names = 2, 4, ["int8"]
    else:
        model, encode, name = run_model(args.run)
        windows = held_out_windows(encode, args.window, args.windows)
        names = ["float32", "int8"]
    arms = measure(model, windows, args.prompts, args.tokens, args.rows, names)
    result = {
        "command": " ".join(
            ["python3 benchmarks/serving/serve_int8_quality.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "run": name,
        "date": datetime.date.today().isoformat(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "held_out": dict(
            windows=len(windows),
            window_tokens=len(windows[0]),
            prompts=args.prompts,
            greedy_tokens=args.tokens,
        ),
        "arms": arms,
    }
    output = args.output or RESULTS / f"serve_int8_quality_{name}_{result['date']}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(arms["int8"]))
    return result


if __name__ == "__main__":
    main()
