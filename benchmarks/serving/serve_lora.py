"""What serving LoRA adapters beside the base costs a step (halyard.serve.adapters, the serve README's "LoRA
adapters").

Three arms, each ``--requests`` greedy requests of ``--tokens`` new tokens (random prompts of 16 tokens):

- ``base``: the model without adapters.
- ``adapters_base_rows``: the model serving ``--adapters`` adapters of rank ``--rank`` on every projection,
  every request for the base (what the adapters' products cost when nobody uses them: they run anyway).
- ``adapters_mixed``: the same, the requests spread over the base and every adapter.

Every arm runs once untimed (compiling its programs), then ``--repeats`` timed runs, interleaved; the fastest
counts (on a shared machine the others' load only ever slows a run down). ``--size small``: a 4-layer Llama of width 256 (a CPU, seconds); ``--size tpu``: Qwen2.5-0.5B's shape
in bfloat16.

Usage::

    python benchmarks/serving/serve_lora.py --size small
    python benchmarks/serving/serve_lora.py --size small --requests 2 --tokens 4 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from halyard.models import init_model, model_config
from halyard.models.lora import TARGET_MODULES, LoraConfig, init_lora
from halyard.named import NamedArray
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.adapters import with_adapters

SIZES = {
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8, num_kv_heads=4),
    "tpu": dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
        param_dtype="bfloat16",
    ),
}  # fmt: skip


def adapters_for(model: object, count: int, rank: int) -> list[tuple[str, dict]]:
    """``count`` adapters of rank ``rank`` on every projection, with random A and B."""
    found = []
    for index in range(count):
        config = LoraConfig(rank=rank, alpha=2.0 * rank, target_modules=tuple(TARGET_MODULES))
        fresh = init_lora(model, config, key=jax.random.key(index))
        found.append(
            (
                f"adapter{index + 1}",
                {
                    name: type(a)(
                        a.lora_a,
                        NamedArray(jax.random.normal(jax.random.key(100 + index), a.lora_b.array.shape, a.lora_b.dtype) * 0.01, a.lora_b.axes),
                        a.alpha,
                    )
                    for name, a in fresh.items()
                },
            )
        )  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/serve_lora.json"))
    args = parser.parse_args()
    model = init_model(model_config("llama", max_position=512, **SIZES[args.size]), jax.random.key(0))
    adapted = with_adapters(model, adapters_for(model, args.adapters, args.rank))
    config = EngineConfig(
        page_size=16, num_pages=512, max_context=256, max_running=args.requests, max_prefill_rows=8
    )
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, SIZES[args.size]["vocab_size"], 16).tolist() for _ in range(args.requests)]
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    arms = {
        "base": (Engine(model, config), [params] * args.requests),
        "adapters_base_rows": (Engine(adapted, config), [params] * args.requests),
        "adapters_mixed": (
            Engine(adapted, config),
            [SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, adapter=i % (args.adapters + 1))
             for i in range(args.requests)],
        ),
    }  # fmt: skip
    for engine, settings in arms.values():
        engine.generate(prompts, settings)  # compiles
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, (engine, settings) in arms.items():
            started = time.perf_counter()
            engine.generate(prompts, settings)
            seconds[name].append(time.perf_counter() - started)
    tokens = args.requests * args.tokens
    results = {name: {"tokens_per_second": tokens / min(times)} for name, times in seconds.items()}
    for name in arms:
        results[name]["relative_to_base"] = (
            results[name]["tokens_per_second"] / results["base"]["tokens_per_second"]
        )
        print(
            f"{name}: {results[name]['tokens_per_second']:.1f} tokens/s, {results[name]['relative_to_base']:.3f}x base"
        )
    record = {"arguments": {k: str(v) for k, v in vars(args).items()}, "results": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
