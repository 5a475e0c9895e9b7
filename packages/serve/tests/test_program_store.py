"""Step programs stored beside the compilation cache (`halyard.serve.program_store`): an engine with
`EngineConfig.compilation_cache` traces each step program once and stores it; the next engine lowers them
from the store, traces none, and gives the traced programs' bits (tokens, log-probs, alternatives, prompt
log-probs), in the fast and the deterministic mode. A damaged file is traced again and replaced; the key
follows what a trace depends on. tests/test_serve_start_phases_smoke.py checks the same across fresh
processes (``halyard serve``'s start)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from tiny_models import tiny_model

from halyard.named.nn import batch_invariant
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.program_store import program_key

CONFIG = EngineConfig(page_size=8, num_pages=16, max_context=32, max_running=3, chunk_size=8)
PROMPTS = [[3, 5, 7, 9, 11, 2, 4], list(range(1, 12)), [8, 6]]
SETTINGS = [
    SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=2),
    SamplingParams(max_tokens=4, temperature=0.9, top_k=6, seed=4, n=2, ignore_eos=True),
    SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=True, ignore_eos=True),
]


def answers(engine: Engine) -> list[Any]:
    """Every sample's tokens, log-probs, alternatives and prompt log-probs for `PROMPTS`."""
    outputs = engine.generate(PROMPTS, SETTINGS)
    return [
        (sample.token_ids, sample.logprobs, sample.top_logprobs, output.prompt_logprobs)
        for output in outputs
        for sample in output.samples
    ]


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model("qwen2")


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_a_stored_program_gives_the_traced_programs_bits(
    model: Any, tmp_path: Path, deterministic: bool
) -> None:
    config = dataclasses.replace(CONFIG, deterministic=deterministic)
    expected = answers(Engine(model, config))  # no store: traced as always
    stored = dataclasses.replace(config, compilation_cache=str(tmp_path))
    first = Engine(model, stored)
    assert answers(first) == expected
    traced = first.stats.programs_traced
    files = sorted((tmp_path / "halyard-programs").glob("*.program"))
    assert traced >= 3 and len(files) == traced, (traced, files)
    second = Engine(model, stored)
    assert answers(second) == expected
    assert second.stats.programs_traced == 0 and len(second.runner.compiled_shapes) == traced


def test_a_damaged_stored_program_is_traced_again_and_replaced(model: Any, tmp_path: Path) -> None:
    stored = dataclasses.replace(CONFIG, compilation_cache=str(tmp_path))
    first = Engine(model, stored)
    expected = answers(first)
    files = sorted((tmp_path / "halyard-programs").glob("*.program"))
    files[0].write_bytes(files[0].read_bytes()[:100])  # cut short
    files[1].write_bytes(b"not a program\n")
    again = Engine(model, stored)
    assert answers(again) == expected and again.stats.programs_traced == 2
    last = Engine(model, stored)
    assert answers(last) == expected and last.stats.programs_traced == 0


def test_the_key_follows_what_the_trace_depends_on() -> None:
    arrays = (np.zeros((4, 3), np.float32), np.zeros(2, np.int32))
    leaves, tree = jax.tree.flatten(arrays)
    key = program_key(leaves, tree, {"alternatives": False})
    assert program_key(leaves, tree, {"alternatives": False}) == key  # the same trace: the same key
    assert program_key(leaves, tree, {"alternatives": True}) != key  # a static argument
    wider, _ = jax.tree.flatten((np.zeros((4, 4), np.float32), np.zeros(2, np.int32)))
    assert program_key(wider, tree, {"alternatives": False}) != key  # a shape
    other_dtype, _ = jax.tree.flatten((np.zeros((4, 3), np.float16), np.zeros(2, np.int32)))
    assert program_key(other_dtype, tree, {"alternatives": False}) != key  # a dtype
    as_dict, dict_tree = jax.tree.flatten({"a": arrays[0], "b": arrays[1]})
    assert program_key(as_dict, dict_tree, {"alternatives": False}) != key  # the tree's structure
    with batch_invariant(rows=8):  # a Halyard context variable the trace reads
        assert program_key(leaves, tree, {"alternatives": False}) != key
    with jax.default_matmul_precision("highest"):  # JAX's configuration
        assert program_key(leaves, tree, {"alternatives": False}) != key
