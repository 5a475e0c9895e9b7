"""The serving benchmark's TPU profile (``benchmarks/serving/serve.py --profile tpu``): Qwen2.5-0.5B shapes in bf16.

Random weights of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads of 64, 2 KV heads, MLP 4864,
vocabulary 151,936, tied; the config in packages/export/tests/fixtures/hf-configs), parameters and KV pages in
bfloat16, greedy, every request run to its ``max_tokens`` (end-of-text ignored). Three phases, each cut off at
``--phase-seconds`` (what was still running is cancelled and the phase says ``truncated``):

- ``at_once``: 256 requests (prompts of 64-1024 tokens, 64-512 new tokens each, seeded) arriving together;
- ``rate``: another 256 such requests arriving one by one at a fixed rate (``--rate`` requests/s; default
  three quarters of the rate ``at_once`` completed them at), time to first token counted from each arrival;
- ``decode``: 128 requests of ``--decode-prompt`` tokens prefilled, then the steps in which all 128 rows
  decode: their median time against the HBM roofline, the bytes a decode step must read (the weights once and
  every running row's keys and values, at `HBM_BYTES_PER_SECOND`).

Reported per phase: output tokens/s, time to first token p50 / p90, and the host's share of a step: the main
thread's CPU time over the step's wall time (the engine waits for the chip without CPU; what the thread
computes, the chip does not overlap with). With ``--size small`` the same path runs a tiny model of the
same family on a CPU in seconds (the smoke test runs it).

Usage::

    python benchmarks/serving/serve.py --profile tpu --compilation-cache /tmp/jax-cache      # on the TPU
    python benchmarks/serving/serve.py --profile tpu-small                                   # anywhere, seconds

With ``--quantization none int8`` the phases run for a bf16 engine, then for an int8 one
(`halyard.serve.EngineConfig.quantization`; their roofline counts the int8 weights' bytes), and the JSON gives
their decode tokens/s ratio::

    python3 benchmarks/serving/serve.py --profile tpu --phases decode --quantization none int8 --compilation-cache /tmp/jc

Results: printed, and JSON (``--output``, default benchmarks/results/serve_tpu.json).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from halyard.export.config_reading import config_from_hf_dict
from halyard.models import CausalLM, init_model, model_config
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.int8_weights import QUANTIZATIONS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_tpu.json"
QWEN_CONFIG = ROOT / "packages/export/tests/fixtures/hf-configs/qwen2/Qwen2.5-0.5B.json"
HBM_BYTES_PER_SECOND = 819e9
"""TPU v5e's HBM bandwidth (the vendor figure, ../shared/TPU.md)."""


@dataclasses.dataclass(frozen=True)
class Size:
    """A profile's workload and engine sizes."""

    requests: int
    prompt_range: tuple[int, int]
    output_range: tuple[int, int]
    decode_rows: int
    decode_prompt: int
    decode_steps: int
    engine: dict[str, Any]


SIZES = {
    "tpu": Size(
        requests=256, prompt_range=(64, 1025), output_range=(64, 513), decode_rows=128, decode_prompt=512,
        decode_steps=32,
        engine=dict(page_size=256, num_pages=128 * 6 + 16, max_context=1536, max_running=128, chunk_size=256,
                    max_prefill_rows=4, min_rows=128),
    ),
    "small": Size(
        requests=24, prompt_range=(4, 40), output_range=(4, 17), decode_rows=8, decode_prompt=16, decode_steps=4,
        engine=dict(page_size=32, num_pages=8 * 2 + 8, max_context=64, max_running=8, chunk_size=16,
                    max_prefill_rows=2, min_rows=8),
    ),
}  # fmt: skip
"""``tpu``: one decoding row count (128) and page buckets of 1, 2, 4 and 6 pages of 256 tokens, so the warm-up
compiles 8 step shapes; ``small``: a tiny model's engine of the same structure."""


def make_model(size: str, dtype: str = "bfloat16") -> CausalLM:
    """Qwen2.5-0.5B's shape (``tpu``) or a two-layer Qwen2 (``small``), random, parameters in ``dtype``."""
    if size == "tpu":
        config, _ = config_from_hf_dict(json.loads(QWEN_CONFIG.read_text()), overrides={"param_dtype": dtype})
    else:
        config = model_config(
            "qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, max_position=256, param_dtype=dtype, tie_embeddings=True,
        )  # fmt: skip
    return init_model(config, jax.random.key(0))


def engine_config(**wanted: Any) -> EngineConfig:
    """An `EngineConfig` of the fields this checkout's engine has (a field it lacks is logged and left out, so
    the benchmark runs on a checkout whose engine changed its knobs)."""
    known = {field.name for field in dataclasses.fields(EngineConfig)}
    dropped = sorted(set(wanted) - known)
    if dropped:
        logging.warning("EngineConfig has no %s here: left out", ", ".join(dropped))
    return EngineConfig(**{name: value for name, value in wanted.items() if name in known})


def requests_of(size: Size, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """``size.requests`` random prompts and their new-token counts."""
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(0, vocab, int(rng.integers(*size.prompt_range))).tolist(), int(rng.integers(*size.output_range)))
        for _ in range(size.requests)
    ]  # fmt: skip


class StepClock:
    """Runs engine steps, noting each step's wall time and the main thread's CPU time in it."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def step(self) -> list[Any]:
        wall, cpu = time.perf_counter(), time.thread_time()
        updates = self.engine.step()
        self.cpu.append(time.thread_time() - cpu)
        self.wall.append(time.perf_counter() - wall)
        return updates

    def host_share(self) -> float:
        """The main thread's CPU time over the steps' wall time."""
        return sum(self.cpu) / max(sum(self.wall), 1e-12)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[int(fraction * (len(ordered) - 1))] if ordered else float("nan")


def run_arrivals(
    engine: Engine, requests: list[tuple[list[int], int]], rate: float | None, limit: float, keep: int = 0
) -> dict[str, Any]:
    """Add ``requests`` all at once (``rate`` None) or one every ``1 / rate`` s, step the engine until all end or
    ``limit`` seconds pass (then cancel the rest): throughput, time to first token from arrival, host share;
    with ``keep``, each request's first ``keep`` tokens (``first_tokens``, in arrival order)."""
    clock = StepClock(engine)
    produced: dict[str, list[int]] = {}
    started = time.perf_counter()
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    done: set[str] = set()
    tokens, pending, truncated = 0, list(requests), False
    while pending or engine.has_work:
        now = time.perf_counter() - started
        while pending and (rate is None or len(arrival) / rate <= now):
            prompt, count = pending.pop(0)
            request = engine.add_request(
                prompt, SamplingParams(max_tokens=count, temperature=0.0, ignore_eos=True)
            )
            arrival[request] = now if rate is None else (len(arrival)) / rate
        if now > limit:
            truncated = True
            for request in set(arrival) - done:
                engine.cancel(request)
            pending = []
        if not engine.has_work:
            time.sleep(max(0.0, len(arrival) / rate - now) if rate else 0.0)
            continue
        for update in clock.step():
            if update.token_ids and update.request_id not in first:
                first[update.request_id] = time.perf_counter() - started - arrival[update.request_id]
            tokens += len(update.token_ids)
            if keep:
                produced.setdefault(update.request_id, []).extend(update.token_ids)
            if update.finish_reason in ("length", "stop"):  # not "abort": cancelled at the limit
                done.add(update.request_id)
    seconds = time.perf_counter() - started
    ttft = list(first.values())
    result = dict(
        requests=len(arrival), finished=len(done), truncated=truncated, seconds=seconds, output_tokens=tokens,
        output_tokens_per_second=tokens / seconds, ttft_p50=percentile(ttft, 0.5), ttft_p90=percentile(ttft, 0.9),
        steps=len(clock.wall), host_share=clock.host_share(), rate=rate,
    )  # fmt: skip
    if keep:
        result["first_tokens"] = [produced.get(request, [])[:keep] for request in arrival]
    return result


def bytes_of(tree: Any) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree) if hasattr(leaf, "dtype"))


def kv_bytes_per_token(model: CausalLM, page_size: int) -> float:
    """The bytes of keys and values one token holds in the engine's pages (all layers)."""
    pages = jax.eval_shape(functools.partial(model.init_pages, 1, page_size))
    return bytes_of(pages) / page_size


def run_decode(
    engine: Engine, model: CausalLM, size: Size, limit: float, trace: Path | None = None
) -> dict[str, Any]:
    """``size.decode_rows`` requests prefilled, then ``size.decode_steps`` steps of all rows decoding: the median
    step against the roofline (weights + every row's keys and values read once, at `HBM_BYTES_PER_SECOND`).
    ``trace``: a folder for a JAX profiler trace (Perfetto JSON included) of the measured steps."""
    rng = np.random.default_rng(2)
    vocab = model.unembedding.axis_size("vocab")
    # Rows prefilled first decode while the others prefill: none may finish before the last has its first token.
    longest = engine.config.max_context - size.decode_prompt
    params = SamplingParams(max_tokens=longest, temperature=0.0, ignore_eos=True)
    ids = [
        engine.add_request(rng.integers(0, vocab, size.decode_prompt).tolist(), params)
        for _ in range(size.decode_rows)
    ]
    length = {request: size.decode_prompt for request in ids}
    clock = StepClock(engine)
    started = time.perf_counter()
    decode_wall, decode_cpu, kv_tokens = [], [], []
    tracing, traced = contextlib.ExitStack(), False
    while engine.has_work and time.perf_counter() - started < limit:
        all_decoding = all(length[r] > size.decode_prompt for r in ids)
        if trace is not None and all_decoding and not traced:
            tracing.enter_context(jax.profiler.trace(str(trace), create_perfetto_trace=True))
            traced = True
        context = sum(length.values())
        updates = clock.step()
        for update in updates:
            length[update.request_id] += len(update.token_ids)
        if all_decoding and len(decode_wall) < size.decode_steps and len(updates) == len(ids):
            decode_wall.append(clock.wall[-1])
            decode_cpu.append(clock.cpu[-1])
            kv_tokens.append(context)
        if len(decode_wall) >= size.decode_steps:
            break
    tracing.close()
    for request in ids:
        engine.cancel(request)
    while engine.has_work:
        engine.step()
    weights = bytes_of(model)
    per_token = kv_bytes_per_token(model, engine.config.page_size)
    step = statistics.median(decode_wall) if decode_wall else float("nan")
    kv = statistics.fmean(kv_tokens) * per_token if kv_tokens else float("nan")
    roofline = (weights + kv) / HBM_BYTES_PER_SECOND
    return dict(
        rows=size.decode_rows, steps_measured=len(decode_wall), step_seconds_median=step,
        step_seconds=decode_wall, weight_bytes=weights, kv_bytes_per_token=per_token, kv_bytes_read=kv,
        roofline_seconds=roofline, over_roofline=step / roofline, host_share=sum(decode_cpu) / max(sum(decode_wall), 1e-12),
        tokens_per_second=size.decode_rows / step,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size", choices=sorted(SIZES), default="tpu", help="tpu: Qwen2.5-0.5B; small: a tiny model"
    )
    parser.add_argument(
        "--phases", nargs="*", default=["decode", "at_once", "rate"], help="which phases, in order"
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="requests/s of the rate phase (default: 3/4 of at_once's)"
    )
    parser.add_argument(
        "--phase-seconds", type=float, default=120.0, help="each phase is cut off after this long"
    )
    parser.add_argument("--compilation-cache", default=None, help="EngineConfig.compilation_cache (a folder)")
    parser.add_argument(
        "--no-warmup", action="store_true", help="compile each step shape at first use instead"
    )
    parser.add_argument(
        "--deterministic", action="store_true", help="EngineConfig.deterministic (fixed token counts)"
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=None,
        help="tokens a page (the pool keeps its tokens; default the size's)",
    )
    parser.add_argument(
        "--trace", type=Path, default=None, help="a folder for a profiler trace of the decode phase"
    )
    parser.add_argument(
        "--quantization",
        nargs="+",
        choices=QUANTIZATIONS,
        default=["none"],
        help="EngineConfig.quantization: each in turn, one engine after the other (none int8: both, and "
        "their decode tokens/s ratio) (default: none)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    size = SIZES[args.size]
    if args.page_size is not None:  # the same pool of tokens in pages of another size
        pool_tokens = size.engine["page_size"] * size.engine["num_pages"]
        engine_sizes = dict(size.engine, page_size=args.page_size, num_pages=pool_tokens // args.page_size)
        size = dataclasses.replace(size, engine=engine_sizes)
    model = make_model(args.size)
    results: dict[str, Any] = dict(
        size=args.size, backend=jax.default_backend(), device=str(jax.devices()[0].device_kind),
        jax=jax.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), arms={},
    )  # fmt: skip
    for quantization in args.quantization:
        arm = run_arm(model, size, args, quantization, parser, results)
        if quantization == args.quantization[0]:  # the figures of one setting where they always were
            results.update(arm)
    decode = {q: arm["decode"]["tokens_per_second"] for q, arm in results["arms"].items() if "decode" in arm}
    if "none" in decode and "int8" in decode:
        results["int8_over_none_decode_tokens_per_second"] = decode["int8"] / decode["none"]
        print(f"int8 / bf16 decode tokens/s: {results['int8_over_none_decode_tokens_per_second']:.3f}")
    args.output.write_text(json.dumps(results, indent=1))
    return results


def run_arm(
    model: CausalLM,
    size: Size,
    args: argparse.Namespace,
    quantization: str,
    parser: argparse.ArgumentParser,
    results: dict[str, Any],
) -> dict[str, Any]:
    """The phases of one engine of ``model`` with ``quantization`` (its figures also in ``results["arms"]``,
    written to ``args.output`` after every phase: a cut-off run keeps its figures)."""
    began = time.perf_counter()
    engine = Engine(
        model,
        engine_config(
            **size.engine,
            warmup=not args.no_warmup,
            compilation_cache=args.compilation_cache,
            deterministic=args.deterministic,
            quantization=quantization,
        ),
    )
    served = engine.runner.model  # int8: the quantized weights, whose bytes the roofline counts
    gc.collect()  # as `halyard serve` does once started: the start's objects out of the collector's scans
    gc.freeze()
    arm: dict[str, Any] = dict(
        quantization=quantization,
        engine_config={k: v for k, v in dataclasses.asdict(engine.config).items()},
        start_seconds=time.perf_counter() - began, programs_compiled_at_start=engine.stats.programs_compiled,
        compile_seconds_at_start=engine.stats.compile_seconds, weight_bytes=bytes_of(served),
    )  # fmt: skip
    results["arms"][quantization] = arm
    print(
        f"{quantization}: engine ready in {arm['start_seconds']:.1f} s ({engine.stats.programs_compiled} programs compiled)"
    )
    vocab = model.unembedding.axis_size("vocab")
    for phase in args.phases:
        if phase == "decode":
            arm[phase] = run_decode(engine, served, size, args.phase_seconds, args.trace)
        elif phase == "at_once":
            arm[phase] = run_arrivals(engine, requests_of(size, vocab, 0), None, args.phase_seconds)
        elif phase == "rate":
            rate = args.rate
            if rate is None:
                at_once = arm.get("at_once")
                rate = (
                    0.75 * at_once["finished"] / at_once["seconds"]
                    if at_once and at_once["finished"]
                    else 4.0
                )
            arm[phase] = run_arrivals(engine, requests_of(size, vocab, 1), rate, args.phase_seconds)
        else:
            parser.error(f"--phases: unknown phase {phase!r}; use decode, at_once, rate")
        shown = phase if len(args.quantization) == 1 else f"{phase} ({quantization})"
        print(shown, json.dumps({k: v for k, v in arm[phase].items() if k != "step_seconds"}), flush=True)
        arm["programs_compiled"] = engine.stats.programs_compiled
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=1))
    print(
        f"programs compiled after start: {engine.stats.programs_compiled - arm['programs_compiled_at_start']}"
    )
    gc.unfreeze()
    del engine, served  # its pool and weights freed before the next arm's
    gc.collect()
    return arm


if __name__ == "__main__":
    main()
