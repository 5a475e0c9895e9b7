"""What structured outputs cost a step: the host's mask per constrained row, and the engine's throughput when
constrained rows share the batch.

Three figures (halyard.serve.grammar, the serve README's "Structured outputs"):

- ``mask_us``: microseconds llguidance takes for one row's token mask (a JSON-schema grammar, mid-object),
  on a byte-level vocabulary of the model's size (random tokens of 1-8 characters: the masks' cost grows with
  the vocabulary's trie, not with its merges).
- ``free_only``: output tokens/s of ``--requests`` free requests (random prompts, ``--tokens`` each).
- ``with_constrained``: the same free requests plus ``--constrained`` JSON-schema requests beside them
  (their steps run unpipelined: a mask needs the token before it); the free requests' tokens/s and the
  whole batch's, and their ratio to ``free_only``.
- ``logit_bias``: the same free requests each with a logit bias (the adjusted programs, still pipelined).

Every arm runs once untimed (compiling its programs), then ``--repeats`` timed runs of each, interleaved; the
median counts. ``--size tpu``: Qwen2.5-0.5B's shape in
bfloat16 (vocabulary 151,936); ``--size small``: a two-layer Qwen2 (a CPU, seconds).

Usage::

    python benchmarks/serving/serve_structured.py --size tpu
    python benchmarks/serving/serve_structured.py --size small --requests 4 --constrained 2 --tokens 16   # smoke

Results: printed and JSON (``--output``, default benchmarks/results/serve_structured.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from serve_tpu import engine_config, make_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from halyard.serve import Engine, SamplingParams
from halyard.serve.grammar import Grammars

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_structured.json"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}},
    },
    "required": ["name", "count", "tags"],
}


def synthetic_tokenizer(vocab: int, seed: int = 0) -> Tokenizer:
    """A byte-level BPE tokenizer of ``vocab`` entries: the 256 bytes, then random strings of 1-8 printable
    characters (no merges: llguidance reads the tokens' bytes, which is what its masks cost depends on)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    rng = np.random.default_rng(seed)
    letters = list('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-{}[]":,.')
    entries = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    while len(entries) < vocab:
        word = "".join(rng.choice(letters, int(rng.integers(2, 9))))
        entries.setdefault(word.replace(" ", "Ġ"), len(entries))
    tokenizer = Tokenizer(models.BPE(vocab=entries, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def mask_microseconds(grammars: Grammars, steps: int, seed: int = 0) -> float:
    """The median time of one row's mask over ``steps`` tokens of a JSON-schema grammar (random allowed
    tokens drawn)."""
    grammar = grammars.json_schema(SCHEMA, "benchmark")
    rng = np.random.default_rng(seed)
    words = (grammars.vocab_size + 31) // 32
    mask = np.zeros((1, words), np.int32)
    constraint, times = grammar.constraint(), []
    for _ in range(steps):
        started = time.perf_counter()
        constraint.fill_mask(mask, 0)
        times.append(time.perf_counter() - started)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[: grammars.vocab_size])
        if constraint.consume(int(rng.choice(allowed))):
            constraint = grammar.constraint()
    return statistics.median(times) * 1e6


def run_arm(engine: Engine, work: list[tuple[list[int], SamplingParams]]) -> tuple[float, int, int]:
    """Seconds of a run of ``work``, its output tokens, and its free requests' tokens."""
    started = time.perf_counter()
    outputs = engine.generate([prompt for prompt, _ in work], [params for _, params in work])
    seconds = time.perf_counter() - started
    tokens = [len(output.samples[0].token_ids) for output in outputs]
    free = sum(t for t, (_, params) in zip(tokens, work, strict=True) if params.grammar is None)
    return seconds, sum(tokens), free


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tpu", "small"], default="small")
    parser.add_argument("--requests", type=int, default=32, help="free requests")
    parser.add_argument("--constrained", type=int, default=8, help="JSON-schema requests beside them")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens of each request")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each arm (the median counts)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    model = make_model(args.size)
    vocab = model.unembedding.axis_size("vocab")
    grammars = Grammars(synthetic_tokenizer(vocab).to_str(), vocab, [0])
    config = engine_config(
        page_size=16, num_pages=1024, max_context=256, max_running=64, chunk_size=256, prefix_cache=False
    )  # every run the same steps: the untimed one compiles them all
    engine = Engine(model, config)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, vocab, 32).tolist() for _ in range(args.requests + args.constrained)]
    free = [
        (prompt, SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=i, ignore_eos=True))
        for i, prompt in enumerate(prompts[: args.requests])
    ]
    grammar = grammars.json_schema(SCHEMA, "benchmark")
    constrained = [
        (prompt, SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=i, grammar=grammar))
        for i, prompt in enumerate(prompts[args.requests :])
    ]
    biased = [(p, SamplingParams(**{**vars_of(s), "logit_bias": ((5, -100.0), (7, 2.0))})) for p, s in free]
    workloads = (("free_only", free), ("with_constrained", free + constrained), ("logit_bias", biased))
    counts = {}
    for name, work in workloads:  # compiles every program the timed runs use
        pipelined = engine.stats.steps_pipelined
        _, tokens, free_tokens = run_arm(engine, work)
        counts[name] = (tokens, free_tokens, engine.stats.steps_pipelined - pipelined)
    timed: dict[str, list[float]] = {name: [] for name, _ in workloads}
    for _ in range(args.repeats):  # the arms interleaved: a busy machine slows each alike
        for name, work in workloads:
            timed[name].append(run_arm(engine, work)[0])
    arms: dict[str, Any] = {}
    for name, _ in workloads:
        seconds, (tokens, free_tokens, pipelined) = statistics.median(timed[name]), counts[name]
        arms[name] = {
            "seconds": seconds,
            "each_repeat": timed[name],
            "tokens_per_second": tokens / seconds,
            "free_tokens_per_second": free_tokens / seconds,
            "steps_pipelined": pipelined,
        }
        print(f"{name}: {tokens / seconds:.1f} tokens/s ({free_tokens / seconds:.1f} of free requests)")
    result = {
        "size": args.size,
        "vocab": vocab,
        "mask_us": mask_microseconds(grammars, 200),
        "arms": arms,
        "ratios": {
            "with_constrained_over_free_only_tokens_per_second": arms["with_constrained"]["tokens_per_second"]
            / arms["free_only"]["tokens_per_second"],
            "free_rows_with_constrained_over_free_only": arms["with_constrained"]["free_tokens_per_second"]
            / arms["free_only"]["tokens_per_second"],
            "logit_bias_over_free_only": arms["logit_bias"]["tokens_per_second"]
            / arms["free_only"]["tokens_per_second"],
        },
    }
    print(f"mask: {result['mask_us']:.0f} us a row (vocabulary {vocab})")
    print(json.dumps(result["ratios"]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))


def vars_of(params: SamplingParams) -> dict[str, Any]:
    return {field: getattr(params, field) for field in params.__dataclass_fields__}


if __name__ == "__main__":
    main()
