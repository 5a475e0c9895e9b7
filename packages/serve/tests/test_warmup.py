"""Compiled once: after `EngineConfig.warmup` a mixed workload (prompts of many lengths, one and two rows,
greedy and sampled, n > 1) compiles nothing more, through the public `Engine` API."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import pytest
from tiny_models import tiny_model

from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.server import add_server_arguments, engine_config_of
from halyard.serve.server.placement import OptionError

WARM = EngineConfig(
    page_size=8, num_pages=12, max_context=16, max_running=2, chunk_size=8, max_prefill_rows=1, warmup=True
)
"""At most 2 + 8 tokens a step: token buckets 1, 2, 4, 8 and 10, page buckets 1 and 2: 10 step shapes, one
program each."""


def programs(engine: Engine) -> int:
    """Step programs ``engine`` compiled or read from the compilation cache (the suite keeps one) so far."""
    return engine.stats.programs_compiled + engine.stats.programs_loaded


def test_after_warmup_a_mixed_workload_compiles_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="halyard.serve.warmup"):
        engine = Engine(tiny_model("llama"), WARM)
    progress = [r.getMessage() for r in caplog.records if "compiled step shape" in r.getMessage()]
    assert progress[0].startswith("compiled step shape 1 of 10 ") and progress[-1].startswith(
        "compiled step shape 10 of 10 "
    )
    warmed = programs(engine)
    assert warmed == 10 and engine.stats.compile_seconds > 0
    prompts = [[3], list(range(1, 8)), list(range(2, 12)), [5, 9, 2, 7, 1], list(range(20, 35))]
    settings = [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.8, top_k=5, seed=1),
        SamplingParams(max_tokens=5, temperature=1.0, top_p=0.9, n=2, seed=2),
        SamplingParams(max_tokens=3, temperature=0.0),
        SamplingParams(max_tokens=1, temperature=0.7, min_p=0.1, seed=3),
    ]
    engine.generate(prompts, settings)  # several at once: two rows, then one
    engine.generate([list(range(40, 53))], SamplingParams(max_tokens=3, temperature=0.0))  # one row, alone
    assert programs(engine) == warmed, [s for s in engine.runner.compiled_shapes]
    assert engine.stats.steps > 10


def test_warmup_logprobs_compiles_the_logprob_variants_too_and_nothing_after() -> None:
    config = dataclasses.replace(WARM, max_context=8, num_pages=4, max_running=1, chunk_size=4, min_rows=4)
    engine = Engine(tiny_model("llama"), dataclasses.replace(config, warmup_logprobs=True))
    warmed = programs(engine)
    assert warmed == 8  # token buckets 4 and 5, one page bucket, four variants
    prompts = [list(range(1, 7)), [3, 4], list(range(10, 15))]
    settings = [
        SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=True, top_logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=3, temperature=0.8, seed=1, top_logprobs=5, ignore_eos=True),
        SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=True, ignore_eos=True),
    ]
    for prompt, setting in zip(prompts, settings, strict=True):
        (output,) = engine.generate([prompt], setting)
        assert len(output.samples[0].token_ids) == setting.max_tokens
    engine.generate(prompts, settings)  # together
    assert programs(engine) == warmed, engine.runner.compiled_shapes
    assert {(s.prompt_logprobs, s.alternatives) for s in engine.runner.compiled_shapes} == {
        (False, False), (False, True), (True, False), (True, True)
    }  # fmt: skip
    with pytest.raises(ValueError, match="warmup_logprobs needs warmup"):
        dataclasses.replace(config, warmup=False, warmup_logprobs=True)


def test_the_server_options_set_warmup_and_the_compilation_cache(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    plain = engine_config_of(parser.parse_args([]))
    assert not plain.warmup and not plain.warmup_logprobs and plain.compilation_cache is None
    chosen = engine_config_of(
        parser.parse_args(["--warmup", "--warmup-logprobs", "--compilation-cache", str(tmp_path)])
    )
    assert chosen.warmup and chosen.warmup_logprobs and chosen.compilation_cache == str(tmp_path)
    assert plain.compile_threads is None
    assert engine_config_of(parser.parse_args(["--warmup", "--compile-threads", "3"])).compile_threads == 3
    with pytest.raises(OptionError, match="^--compile-threads must be a positive int or None, got 0$"):
        engine_config_of(parser.parse_args(["--compile-threads", "0"]))


def test_warmup_compiles_in_threads_and_then_compiles_nothing_in_deterministic_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two threads compile the two bucket shapes (4 and 5 tokens, one page bucket), the fast mode's; nothing is
    probed or compiled after, by a workload either."""
    small = dict(max_context=8, num_pages=4, max_running=1, chunk_size=4, min_rows=4)
    config = dataclasses.replace(WARM, **small, deterministic=True, compile_threads=2)
    with caplog.at_level(logging.INFO, logger="halyard.serve.warmup"):
        engine = Engine(tiny_model("llama"), config)
    messages = [r.getMessage() for r in caplog.records]
    assert "warm-up: compiling 2 step shapes, 2 at a time" in messages
    assert sum("compiled step shape" in m for m in messages) == 2
    assert set(engine.runner.compiled_shapes) == set(engine.runner.bucket_shapes())
    # 2, or fewer where this process compiled the same program before
    warm = programs(engine)
    assert warm <= 2
    prompts = [[3], list(range(1, 7)), [2, 4]]
    engine.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert programs(engine) == warm


def test_compile_threads_is_checked() -> None:
    with pytest.raises(
        ValueError, match="EngineConfig.compile_threads must be a positive int or None, got 0"
    ):
        EngineConfig(compile_threads=0)


def test_the_default_token_ladder_has_half_steps_from_48() -> None:
    """64 rows beside 4 chunks of 128 (576 tokens at most): powers of two, and from 48 up 1.5 times each,
    so a step of 40 tokens runs in a program of 48 and one of 300 in one of 384."""
    config = EngineConfig(page_size=8, num_pages=80, max_context=64, max_running=64, chunk_size=128)
    runner = Engine(tiny_model("llama"), config).runner
    half_steps = [48, 96, 192, 384]
    assert runner.token_sizes == sorted([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, *half_steps, 576])
    assert [runner.shape_for(tokens, 1).tokens for tokens in (32, 40, 65, 300, 513)] == [32, 48, 96, 384, 576]
    assert Engine(tiny_model("llama"), dataclasses.replace(config, min_rows=128)).runner.token_sizes == [
        128, 192, 256, 384, 512, 576,
    ]  # fmt: skip


def test_token_buckets_are_the_programs_below_the_most_and_bad_ones_are_refused() -> None:
    """``token_buckets=(2,)``: a step of at most 2 tokens runs in a program of 2, a larger one at the most
    (10); in deterministic mode warm-up compiles those two (one page bucket), and a workload of prefill chunks
    and decoding rows compiles nothing more."""
    fast = Engine(tiny_model("llama"), dataclasses.replace(WARM, token_buckets=(2,), warmup=False))
    assert [fast.runner.shape_for(tokens, 1).tokens for tokens in (1, 2, 3, 10)] == [2, 2, 10, 10]
    small = dict(max_context=8, num_pages=4, token_buckets=(2,), deterministic=True)
    engine = Engine(tiny_model("llama"), dataclasses.replace(WARM, **small))
    assert sorted(s.tokens for s in engine.runner.compiled_shapes) == [2, 10]
    warm = programs(engine)  # 2, or fewer where this process compiled the same program before
    assert warm <= 2
    prompts = [[3], [1, 2, 3, 4], [5, 9, 2]]
    engine.generate(prompts, SamplingParams(max_tokens=3, temperature=0.8, seed=1, n=2, ignore_eos=True))
    assert programs(engine) == warm, engine.runner.compiled_shapes
    for bad in ((2, 2), (0,), (4, 1), (1.5,), [True], 3):
        with pytest.raises(
            ValueError, match="^EngineConfig.token_buckets must be ascending positive ints, got"
        ):
            dataclasses.replace(WARM, token_buckets=bad)
    with pytest.raises(ValueError, match="^EngineConfig takes token_buckets or min_rows, not both$"):
        dataclasses.replace(WARM, token_buckets=(4,), min_rows=2)
    assert dataclasses.replace(WARM, token_buckets=[1, 4]).token_buckets == (1, 4)
