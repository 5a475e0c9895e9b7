"""The inference engine against transformers' batched ``generate`` and Halyard's old left-padded ``generate``.

One model, the ``llama`` benchmark shape (6 layers, hidden 512, MLP 1536, GQA 8/4, vocab 8192; positions up
to 512), one workload: 128 requests with prompts of 16-192 tokens and 16-128 new tokens each (seeded), all
arriving at once, greedy. Arms, each run in this process once to compile and again for the figures (the
engine's modes ``--repeats`` times each, interleaved, their median run reported, each run from an empty
prefix cache; the deterministic / fast cost is the median of the repetitions' ratios), except the old
``generate``, which runs in a subprocess on the checkout of the last commit that had it:

- ``engine``: `halyard.serve.Engine`, fast mode (continuous batching, chunked prefill, 64 running sequences);
- ``engine_deterministic``: the same, ``deterministic=True`` (batch-invariant programs of the fast mode's
  sizes: products in blocks of 32 rows, sums in a fixed order);
- ``engine_training_arithmetic``: deterministic with ``training_arithmetic=True``: the same programs (this
  process keeps XLA's fused multiply-adds, so the figure leaves out what `unfuse_multiply_add` costs);
- ``transformers``: ``LlamaForCausalLM.generate`` on the same weights (exported with `halyard.export`),
  batches of 32 requests in arrival order, left-padded, each batch run to its longest request's length;
- ``old_generate``: ``halyard.models.sampling.generate`` as of commit `OLD_GENERATE_COMMIT` (left-padded
  static batches of 32, one compiled loop per batch shape; its compiled shapes are warm in the reported run).

Reported: the machine (`cpu_machine.describe`: cores, hyperthreads, vector instructions, threads), throughput
(requested tokens generated per second of wall time), time to first token per request (from the common arrival
to its first token: queueing included) as mean / median / p90, and the ratios engine / transformers (goal >= 2
on CPU), engine / old generate, deterministic / fast cost (goal <= 1.15), and training arithmetic / fast.

Usage::

    python benchmarks/serving/serve.py                 # the llama shape, 128 requests
    python benchmarks/serving/serve.py --quick         # a tiny model, 16 requests (a smoke test)
    python benchmarks/serving/serve.py --skip old_generate
    python benchmarks/serving/serve.py --quick --warmup --skip transformers old_generate   # compile every shape at start
    python benchmarks/serving/serve.py --profile tpu        # Qwen2.5-0.5B shapes in bf16, 256 requests (serve_tpu.py)
    python benchmarks/serving/serve.py --profile tpu-small  # the same path with a tiny model, on a CPU in seconds

Results are printed and written as JSON (``--output``, default benchmarks/results/serve.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and baselines
import cpu_machine
from benchmark_models import QUICK_LLAMA, llama_config
from llama_baselines import LlamaShapes

from halyard.models import CausalLM, init_model
from halyard.serve import Engine, EngineConfig, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve.json"
OLD_GENERATE_COMMIT = "f32b661"
"""The last commit with ``halyard.models.sampling.generate`` (the left-padded static-batch sampler)."""
ARMS = ("engine", "engine_deterministic", "engine_training_arithmetic", "transformers", "old_generate")
ENGINE_MODES = {
    "engine": {},
    "engine_deterministic": {"deterministic": True},
    "engine_training_arithmetic": {"deterministic": True, "training_arithmetic": True},
}
"""Each engine arm's `EngineConfig` fields beyond the shared ones."""
PROFILES = ("llama", "quick", "tpu", "tpu-small")


@dataclass(frozen=True)
class Workload:
    """The requests: prompt token ids and new-token counts, and the batch size of the static arms."""

    prompts: list[list[int]]
    new_tokens: list[int]
    static_batch: int

    @classmethod
    def make(
        cls,
        requests: int,
        vocab: int,
        prompt_range: tuple[int, int],
        output_range: tuple[int, int],
        static_batch: int,
    ) -> Workload:
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, vocab, int(rng.integers(*prompt_range))).tolist() for _ in range(requests)]
        new_tokens = [int(rng.integers(*output_range)) for _ in range(requests)]
        return cls(prompts, new_tokens, static_batch)

    def batches(self) -> list[list[int]]:
        order = list(range(len(self.prompts)))
        return [order[i : i + self.static_batch] for i in range(0, len(order), self.static_batch)]


def summary(seconds: float, first_token: list[float], tokens: int) -> dict[str, float]:
    ordered = sorted(first_token)
    return dict(
        seconds=seconds,
        tokens=tokens,
        tokens_per_second=tokens / seconds,
        ttft_mean=statistics.fmean(ordered),
        ttft_median=statistics.median(ordered),
        ttft_p90=ordered[int(0.9 * (len(ordered) - 1))],
    )


def run_engines(
    model: CausalLM,
    workload: Workload,
    modes: dict[str, dict[str, bool]],
    context: int,
    repeats: int,
    warmup: bool = False,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]]]:
    """Each engine arm (name -> its `EngineConfig` fields) runs the workload once to compile (after compiling
    its whole shape set at start with ``warmup``), then ``repeats`` times, the arms interleaved so that a slow
    minute of the machine falls on all. Returns each arm's median run and, for each other arm run beside
    ``engine``, its time / the fast mode's of each repetition."""
    engines: dict[str, Engine] = {}
    start_seconds: dict[str, float] = {}
    for name, fields in modes.items():
        began = time.perf_counter()
        engines[name] = Engine(
            model,
            EngineConfig(
                page_size=64, num_pages=64 * -(-context // 64) + 8, max_context=context, max_running=64,
                chunk_size=128, max_prefill_rows=4, warmup=warmup, **fields,
            ),
        )  # fmt: skip
        start_seconds[name] = time.perf_counter() - began
    compiled_at_start = {name: engine.stats.programs_compiled for name, engine in engines.items()}
    first = {name: run_workload(engine, workload) for name, engine in engines.items()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, engine in engines.items():
            runs[name].append(run_workload(engine, workload))
    arms = {}
    for name, engine in engines.items():
        median = sorted(runs[name], key=lambda run: run["seconds"])[len(runs[name]) // 2]
        arms[name] = dict(
            median,
            compile_seconds=engine.runner.compile_seconds,
            start_seconds=start_seconds[name],
            first_run_seconds=first[name]["seconds"],
            compiled_shapes=len(engine.runner.compiled_shapes),
            programs_compiled=engine.stats.programs_compiled,
            programs_compiled_at_start=compiled_at_start[name],
            repeat_seconds=[run["seconds"] for run in runs[name]],
        )
    pairs = {
        name: [run["seconds"] / fast["seconds"] for fast, run in zip(runs["engine"], runs[name])]
        for name in runs
        if name != "engine" and "engine" in runs
    }
    return arms, pairs


def run_workload(engine: Engine, workload: Workload) -> dict[str, float]:
    """Every request of ``workload`` added at once and run to its end: throughput and time to first token.
    The run starts from an empty prefix cache: the previous run's prompts would otherwise skip most of their
    prefill, which the static arms cannot."""
    engine.pages.clear_cache()
    started = time.perf_counter()
    first: dict[str, float] = {}
    ids = [
        engine.add_request(prompt, SamplingParams(max_tokens=count, temperature=0.0, ignore_eos=True))
        for prompt, count in zip(workload.prompts, workload.new_tokens)
    ]
    generated = 0
    while engine.has_work:
        for update in engine.step():
            if update.token_ids and update.request_id not in first:
                first[update.request_id] = time.perf_counter() - started
            generated += len(update.token_ids)
    assert generated == sum(workload.new_tokens) and len(first) == len(ids)
    return summary(time.perf_counter() - started, [first[i] for i in ids], generated)


class FirstTokenClock:
    """A transformers logits processor that notes when the first token's logits are ready (seconds since
    ``started``) and changes nothing."""

    def __init__(self, started: float):
        self.started = started
        self.first = 0.0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if not self.first:
            self.first = time.perf_counter() - self.started
        return scores


def run_transformers(folder: Path, workload: Workload) -> dict[str, float]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    model.generation_config.eos_token_id = None
    results = []
    for _ in range(2):
        started = time.perf_counter()
        first: list[float] = [0.0] * len(workload.prompts)
        for batch in workload.batches():
            prompts = [workload.prompts[i] for i in batch]
            longest = max(map(len, prompts))
            ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
            clock = FirstTokenClock(started)
            with torch.no_grad():
                model.generate(
                    ids, attention_mask=mask, max_new_tokens=max(workload.new_tokens[i] for i in batch),
                    do_sample=False, pad_token_id=0, logits_processor=[clock],
                )  # fmt: skip
            for index in batch:
                first[index] = clock.first
        results.append(summary(time.perf_counter() - started, first, sum(workload.new_tokens)))
    warm = results[1]
    warm["first_run_seconds"] = results[0]["seconds"]
    return warm


OLD_GENERATE_SCRIPT = """
import json, sys, time
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
from benchmark_models import llama_config
from llama_baselines import LlamaShapes
from halyard.models import init_model
from halyard.models.sampling import SamplingConfig, generate
job = json.loads(open(sys.argv[2]).read())
model = init_model(llama_config(LlamaShapes(**job["shapes"])), jax.random.key(0))
results = []
for _ in range(2):
    started = time.perf_counter()
    first = [0.0] * len(job["prompts"])
    probing = 0.0
    for batch in job["batches"]:
        count = max(job["new_tokens"][i] for i in batch)
        config = SamplingConfig(max_new_tokens=count, temperature=0.0, stop_tokens=())
        begun = time.perf_counter() - started - probing  # when this batch starts, probes not counted
        one = generate(model, [job["prompts"][i] for i in batch], SamplingConfig(max_new_tokens=1, temperature=0.0, stop_tokens=()))
        np.asarray(one.tokens)
        prefill = time.perf_counter() - started - probing - begun  # the batch's first token
        probing += prefill
        out = generate(model, [job["prompts"][i] for i in batch], config)
        np.asarray(out.tokens)
        for index in batch:
            first[index] = begun + prefill
    results.append(dict(seconds=time.perf_counter() - started - probing, first=first))
print(json.dumps(results))
"""


def run_old_generate(shapes: LlamaShapes, workload: Workload, checkout: Path | None) -> dict[str, float]:
    """The old sampler in a subprocess on a checkout of `OLD_GENERATE_COMMIT` (a temporary git worktree
    unless ``checkout`` is given). Its time to first token is the batch's start plus a one-token run of the
    same batch (the old sampler streams nothing), and that one-token run is not counted in its time."""
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        if checkout is None:
            checkout = folder / "old"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), OLD_GENERATE_COMMIT],
                check=True,
                capture_output=True,
            )
        try:
            job = folder / "job.json"
            job.write_text(
                json.dumps(
                    dict(
                        shapes=shapes.__dict__,
                        prompts=workload.prompts,
                        new_tokens=workload.new_tokens,
                        batches=workload.batches(),
                    )
                )
            )
            sources = [str(checkout / "packages" / name / "src") for name in ("named", "shard", "models")]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sources))
            done = subprocess.run(
                [sys.executable, "-c", OLD_GENERATE_SCRIPT, str(checkout / "benchmarks"), str(job)],
                check=True, capture_output=True, text=True, env=env,
            )  # fmt: skip
        finally:
            if checkout == folder / "old":
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)],
                    capture_output=True,
                )
    first_run, warm = json.loads(done.stdout.strip().splitlines()[-1])
    result = summary(warm["seconds"], warm["first"], sum(workload.new_tokens))
    result["first_run_seconds"] = first_run["seconds"]
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model and 16 requests (a smoke test)")
    parser.add_argument("--skip", nargs="*", default=[], choices=ARMS, help="arms to leave out")
    parser.add_argument(
        "--old-checkout", type=Path, default=None, help=f"a checkout of {OLD_GENERATE_COMMIT}"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="warm runs of each engine arm, interleaved (median reported)"
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="the engines compile their whole shape set at start (EngineConfig.warmup)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="llama",
        help="llama: the arms above; quick: --quick; tpu, tpu-small: benchmarks/serving/serve_tpu.py (its own options)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args, rest = parser.parse_known_args(argv)
    if args.profile in ("tpu", "tpu-small"):
        import serve_tpu

        output = [] if args.output == RESULTS else ["--output", str(args.output)]
        size = "tpu" if args.profile == "tpu" else "small"
        return serve_tpu.main(["--size", size, *output, *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.quick = args.quick or args.profile == "quick"

    if args.quick:
        shapes = replace(QUICK_LLAMA, seq_len=128)
        workload = Workload.make(16, shapes.vocab_size, (4, 40), (4, 24), static_batch=8)
    else:
        shapes = replace(LlamaShapes(), seq_len=512)
        workload = Workload.make(128, shapes.vocab_size, (16, 193), (16, 129), static_batch=32)
    context = shapes.seq_len
    model = init_model(llama_config(shapes), jax.random.key(0))
    results: dict[str, Any] = {"model": shapes.__dict__, "requests": len(workload.prompts)}
    arms: dict[str, dict[str, Any]] = {}
    modes = {name: fields for name, fields in ENGINE_MODES.items() if name not in args.skip}
    engine_arms, pairs = run_engines(model, workload, modes, context, args.repeats, args.warmup)
    arms.update(engine_arms)
    if "transformers" not in args.skip:
        from halyard.export import export_hf

        with tempfile.TemporaryDirectory() as folder:
            export_hf(model, folder)
            arms["transformers"] = run_transformers(Path(folder), workload)
    if "old_generate" not in args.skip:
        arms["old_generate"] = run_old_generate(shapes, workload, args.old_checkout)
    results["arms"] = arms
    results["machine"] = cpu_machine.describe()  # after the arms: torch's threads once it is imported
    ratios: dict[str, float] = {}
    engine = arms.get("engine")
    if engine is not None:
        for other in ("transformers", "old_generate"):
            if other in arms:
                ratios[f"engine_over_{other}_throughput"] = (
                    engine["tokens_per_second"] / arms[other]["tokens_per_second"]
                )
                ratios[f"{other}_over_engine_ttft_median"] = (
                    arms[other]["ttft_median"] / engine["ttft_median"]
                )
        for name, each in pairs.items():
            label = name.removeprefix("engine_")
            ratios[f"{label}_over_fast_seconds"] = statistics.median(each)
            results[f"{label}_over_fast_each_repeat"] = each
    results["ratios"] = ratios
    print(cpu_machine.summary(results["machine"]))
    for name, arm in arms.items():
        print(
            f"{name:27s} {arm['tokens_per_second']:9.1f} tokens/s  {arm['seconds']:7.2f} s  "
            f"ttft mean {arm['ttft_mean']:.2f} median {arm['ttft_median']:.2f} p90 {arm['ttft_p90']:.2f} s"
            + (f"  (first run {arm['first_run_seconds']:.1f} s)" if "first_run_seconds" in arm else "")
            + (
                f"  ({arm['programs_compiled']} programs compiled in {arm['compile_seconds']:.1f} s, "
                f"{arm['programs_compiled_at_start']} at start)"
                if "programs_compiled" in arm
                else ""
            )
        )
    for name, value in ratios.items():
        print(f"{name:40s} {value:.3f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
