"""``halyard generate``: continue prompts with a run's checkpoint (weights only: no optimizer, no Trainer)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import jax

from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.int8_weights import QUANTIZATIONS
from halyard.train.data_assembly.tokenizer import load_run_tokenizer
from halyard.train.run.loading import load_run_model


def generate_main(argv: Sequence[str]) -> int:
    """Continue prompts with a run's checkpoint; several prompts print one after another, each under a
    ``--- prompt N of M ---`` line."""
    parser = argparse.ArgumentParser(prog="halyard generate", description=generate_main.__doc__)
    parser.add_argument("--run", required=True, help="the run folder (trainer.run_dir)")
    parser.add_argument(
        "--prompt", action="append", required=True, help="text to continue (repeat for several)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens to add (default: 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (default 0: all)")
    parser.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="sample from the likeliest tokens holding this much probability (default 1: all)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sampling key's seed (default: 0)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="none",
        help="int8: the attention and MLP weights and the output head as int8 with a scale per output "
        "channel (default: none)",
    )
    args = parser.parse_args(argv)

    loaded = load_run_model(Path(args.run), args.step)
    tokenizer = load_run_tokenizer(loaded.tokenizer)
    prompts = [tokenizer.encode(p).ids or [0] for p in args.prompt]
    params = SamplingParams(
        max_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    model = jax.device_get(loaded.model)
    context = max(len(p) for p in prompts) + args.max_new_tokens
    if model.position_limit is not None:
        context = min(context, model.position_limit)
    config = EngineConfig.sized_for(sequences=len(prompts), context=context, quantization=args.quantization)
    engine = Engine(model, config)
    outputs = engine.generate(prompts, params)
    for number, (prompt, output) in enumerate(zip(args.prompt, outputs), start=1):
        if len(args.prompt) > 1:
            print(f"--- prompt {number} of {len(args.prompt)} ---")
        print(prompt + tokenizer.decode(output.samples[0].token_ids))  # a stop token ends a continuation
    return 0
