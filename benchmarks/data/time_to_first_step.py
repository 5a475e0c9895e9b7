"""Benchmark: the trainer's time to its first step on a corpus it has to tokenize, against an offline build.

The trainer builds the token cache in the background and starts training as soon as the first batches
exist (``data.shuffle: era``), so its time to first step should be a small part of the time a full build
takes. Measured in the same run, on the same corpus and cores:

- ``time_to_first_step_over_offline_build``: seconds from creating the `Trainer` to the end of step 1
  (tokenizer, model and state setup, compilation and the wait for the first era included) over the
  seconds of ``build_cache`` of the whole corpus (goal: at most 0.25), for a run in a fresh process with
  an empty compilation cache (cold) and for a second run of the same config whose programs come from the
  persistent compilation cache (``warm_...``: what a resumed or repeated run sees);
- ``loader_over_step_consumption``: while the build still runs, the loader's tokens/s over what the
  trainer's steps consume per second (goal: above 1, so a running build does not slow the steps).

Data: ../shared/data/corpora/tinyshakespeare.txt replicated to 150 MB of jsonl shards (``--quick``: 4 MB)
and the 49k BPE tokenizer from ../shared/data/tokenizers/bpe49k (without them, generated text and a BPE
trained here: see data_cache.py). Results go to benchmarks/results/time_to_first_step.json.

    python benchmarks/data/time_to_first_step.py [--quick] [--megabytes 150] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from data_cache import corpus_text, load_tokenizer, make_documents, write_shards

from halyard.data import LMDataset, Loader, TokenCache, build_cache
from halyard.data.builders.local import default_num_workers

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "time_to_first_step.json"
SEQ_LEN, BATCH, ERA = 256, 8, 64  # an era is 8 steps


def run_config(
    work: Path, tokenizer_path: Path, vocab_size: int, workers: int, steps: int, name: str = "run"
) -> Path:
    """A tiny Llama on the generated shards, building its cache in ``work/NAME/cache`` while it trains,
    with its persistent compilation cache in ``work/jax-cache`` (empty before the first run)."""
    values = {
        "model": {
            "type": "llama",
            "vocab_size": -(-vocab_size // 128) * 128,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "max_position": SEQ_LEN,
        },
        "data": {
            "sources": [str(work / "src")],
            "tokenizer": str(tokenizer_path),
            "seq_len": SEQ_LEN,
            "shuffle": "era",
            "era_windows": ERA,
            "num_workers": workers,
        },
        "trainer": {
            "run_dir": str(work / name),
            "compilation_cache": str(work / "jax-cache"),
            "steps": steps,
            "batch_size": BATCH,
            "log_every": 5,
            "progress": False,
        },
        "checkpoint": {"every_steps": None, "every_seconds": None},
        "trackers": [{"type": "jsonl"}],
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


TRAIN_SCRIPT = """
import json, sys, time
from halyard.train.cli import resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.trainer import Trainer

if __name__ == "__main__":
    config = parse_config(TrainConfig, resolve_config_paths(["--config", sys.argv[1]]))
    started = time.monotonic()
    trainer = Trainer(config)
    setup_seconds = time.monotonic() - started
    result = trainer.fit()
    print("RESULT " + json.dumps({
        "first_step": setup_seconds + result.summary["goodput/time_to_first_step_seconds"],
        "tokens_per_second": result.last_metrics["tokens_per_second"],
        "still_building": result.last_metrics.get("data/build_finished", 1.0) == 0.0,
        "programs_loaded": result.summary["compilation_cache/programs_loaded"],
    }))
"""


def train(config_path: Path) -> dict[str, Any]:
    """One trainer run in a fresh process (nothing compiled in memory): seconds from `Trainer(...)` to the
    end of step 1 (``first_step``), the later steps' tokens/s, whether the build was still running when
    training ended, and how many programs came from the persistent compilation cache."""
    script = config_path.parent / "train_once.py"
    script.write_text(TRAIN_SCRIPT)
    completed = subprocess.run(
        [sys.executable, str(script), str(config_path)], capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the trainer run failed:\n{completed.stderr[-3000:]}")
    print(completed.stdout.rsplit("RESULT", 1)[0], end="", flush=True)
    return json.loads(completed.stdout.rsplit("RESULT ", 1)[1])


def loader_tokens_per_second(
    work: Path, tokenizer_path: Path, workers: int, steps: int
) -> tuple[float, bool]:
    """The loader's tokens/s over ``steps`` batches already built, while a build of the corpus runs."""
    handle = build_cache(
        str(work / "src"),
        str(tokenizer_path),
        str(work / "streamed"),
        num_workers=workers,
        progress=False,
        background=True,
    )
    cache = TokenCache.open(str(work / "streamed"))
    dataset = LMDataset(cache, SEQ_LEN, shuffle="era", era_windows=ERA)
    dataset.batch(steps - 1, BATCH)  # wait until these batches exist
    with Loader(dataset, BATCH, stop_step=steps, prefetch=8) as loader:
        started = time.perf_counter()
        for _ in loader:
            pass
        seconds = time.perf_counter() - started
    still_building = not handle.done()
    handle.stop(timeout=60)
    return steps * BATCH * SEQ_LEN / seconds, still_building


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~4 MB and a few steps (smoke run)")
    parser.add_argument("--megabytes", type=float, default=None, help="corpus size (default 150, quick 4)")
    parser.add_argument("--workers", type=int, default=default_num_workers(), help="build processes")
    parser.add_argument("--output", default=str(RESULTS), help="where to write the JSON results")
    args = parser.parse_args()
    megabytes = args.megabytes or (4.0 if args.quick else 150.0)
    steps = 10 if args.quick else 40

    text, corpus_source = corpus_text()
    tokenizer, tokenizer_source = load_tokenizer(text)
    documents = make_documents(text, megabytes)
    work = Path(tempfile.mkdtemp(prefix="halyard-ttfs-bench-"))
    try:
        tokenizer_path = work / "tokenizer.json"
        tokenizer.save(str(tokenizer_path))
        write_shards(documents, work / "src", num_shards=64)
        started = time.monotonic()
        offline = build_cache(
            str(work / "src"),
            str(tokenizer_path),
            str(work / "offline"),
            num_workers=args.workers,
            progress=False,
        )
        offline_seconds = time.monotonic() - started
        assert isinstance(offline, TokenCache)
        # Cold: nothing compiled yet. Warm: a second run of the same config in a new run dir (it tokenizes
        # again) whose programs come from the compilation cache, as a resumed or repeated run's do.
        cold = train(
            run_config(work, tokenizer_path, tokenizer.get_vocab_size(), args.workers, steps, "cold")
        )
        warm = train(
            run_config(work, tokenizer_path, tokenizer.get_vocab_size(), args.workers, steps, "warm")
        )
        loader_rate, built_while_loading = loader_tokens_per_second(work, tokenizer_path, args.workers, steps)
        results = {
            "corpus": corpus_source,
            "tokenizer": tokenizer_source,
            "megabytes": round(sum(map(len, documents)) / 1e6, 1),
            "tokens": offline.num_tokens,
            "workers": args.workers,
            "offline_build_seconds": round(offline_seconds, 2),
            "time_to_first_step_seconds": round(cold["first_step"], 2),
            "time_to_first_step_over_offline_build": round(cold["first_step"] / offline_seconds, 3),
            "warm_time_to_first_step_seconds": round(warm["first_step"], 2),
            "warm_time_to_first_step_over_offline_build": round(warm["first_step"] / offline_seconds, 3),
            "warm_programs_loaded_from_the_compilation_cache": warm["programs_loaded"],
            "build_still_running_when_training_ended": cold["still_building"],
            "step_consumption_tokens_per_second": round(cold["tokens_per_second"]),
            "loader_tokens_per_second_while_building": round(loader_rate),
            "build_still_running_while_loading": built_while_loading,
            "loader_over_step_consumption": round(loader_rate / cold["tokens_per_second"], 2),
            "quick": args.quick,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"time to first step / offline build: {results['time_to_first_step_over_offline_build']:.3f} "
        f"({results['time_to_first_step_seconds']:.1f} s / {results['offline_build_seconds']:.1f} s; goal <= 0.25)"
    )
    print(
        f"the same with the compilation cache warm: {results['warm_time_to_first_step_over_offline_build']:.3f} "
        f"({results['warm_time_to_first_step_seconds']:.1f} s, "
        f"{results['warm_programs_loaded_from_the_compilation_cache']} programs loaded)"
    )
    print(
        f"loader while building / step consumption: {results['loader_over_step_consumption']:.1f}x (goal > 1)"
    )
    print(json.dumps(results, indent=1))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
