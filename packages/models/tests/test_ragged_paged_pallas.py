"""The Pallas ragged paged attention kernel (`halyard.models.attention.ragged_paged_pallas`) against a dense
numpy reference, in Pallas's TPU interpreter on CPU and compiled on a TPU (marker ``tpu``).

One ragged step (ragged_case.py) covers a prefill chunk and decode rows in one batch, grouped-query
attention, two sequences sharing a prefix page, padding tokens (slot -1, output 0) and a padding sequence
slot, a layer index other than 0, and several query and page blocks; in float32 with a sliding window and a
soft cap, 9 query heads on 3 kv heads of 64 (3 rows padded to 4, groups of 3 to 4, 64 lanes to 128), in
bfloat16 without, 4 on 2 kv heads of 64 (both in one row of 128 lanes). Each interpreted call costs 5-10 s (the interpreter's program compiles), so the
cases are few and share their inputs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import decoder_terms, summation_tolerance
from ragged_case import (
    HEAD_SIZE,
    KV_HEADS,
    LAYERS,
    PAGES,
    SCALE,
    SEQS,
    STEP_LAYER,
    TABLE_WIDTH,
    RaggedStep,
    dense_reference,
    ragged_step,
    reference_terms,
)

from halyard.models.attention import ragged_paged_pallas
from halyard.models.attention.pallas_paged_layout import RowLayout, padded_query_group
from halyard.models.attention.ragged_paged_pallas import (
    POOL_AXES,
    PallasPagedKernel,
    decode_blocks,
    kernel_sequences,
    kv_pages_in_vmem,
    pallas_unsupported_reason,
)

SETTINGS = {  # dtype name: (query heads, kv heads, sliding_window, logit_softcap)
    "float32": (9, 3, 6, 2.0),
    "bfloat16": (4, 2, None, None),
}
BLOCKS = {  # dtype name: (num_kv_pages_per_block, num_queries_per_block)
    "float32": (1, 4),  # a page a block: the online softmax over blocks; the chunk spans two query blocks
    "bfloat16": (2, 8),  # the 3-page row: a full block, then one whose second page lies past its keys
}


def run_kernel(kernel, step: RaggedStep, dtype, *, sliding_window, logit_softcap) -> np.ndarray:
    """The step through a kernel's interface: every layer's earlier keys written, then the step's tokens
    into `STEP_LAYER` (padding slots -1), then the step prepared and one ``attend`` of that layer, all in one
    program."""
    pool = kernel.init_pool(LAYERS, PAGES, step.page_size, step.slot_keys.shape[2], HEAD_SIZE, dtype)
    keys, values = step.step_keys(STEP_LAYER)

    def program(pool, query, keys, values):
        for layer in range(LAYERS):
            history = jnp.asarray(step.history_slots)
            pool = kernel.write(
                pool,
                jnp.int32(layer),
                jnp.asarray(step.slot_keys[layer][step.history_slots]),
                jnp.asarray(step.slot_values[layer][step.history_slots]),
                history,
            )
        layer = jnp.int32(STEP_LAYER)
        pool = kernel.write(pool, layer, keys, values, jnp.asarray(step.slots))
        batch = (step.page_table, step.cu_q_lens, step.kv_lens, step.num_seqs)
        prepared = kernel.prepare(pool, *map(jnp.asarray, batch), tokens=query.shape[0])
        return kernel.attend(
            query,
            pool,
            layer,
            prepared,
            scale=SCALE,
            sliding_window=sliding_window,
            logit_softcap=logit_softcap,
        )

    output = jax.jit(program)(pool, jnp.asarray(step.query), jnp.asarray(keys), jnp.asarray(values))
    assert output.shape == step.query.shape and output.dtype == step.query.dtype
    return np.asarray(output.astype(jnp.float32))


def tolerance(reference: np.ndarray, dtype_name: str) -> float:
    """Float32 arithmetic in another order (`reference_terms`); at bfloat16, also one rounding of the output
    and one of the softmax's weights before the values' product (a TPU matmul's bfloat16 pass)."""
    bound = summation_tolerance(reference, reference_terms(), np.float32)
    if dtype_name == "bfloat16":
        bound += 2 * summation_tolerance(reference, 1, jnp.bfloat16)
    return bound


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def interpreted(request: pytest.FixtureRequest) -> tuple[str, RaggedStep, np.ndarray]:
    """``(dtype name, step, the kernel's output)`` in the TPU interpreter."""
    dtype = jnp.dtype(request.param)
    query_heads, kv_heads, window, cap = SETTINGS[request.param]
    step = ragged_step(dtype, query_heads, kv_heads)
    output = run_kernel(
        PallasPagedKernel(*BLOCKS[request.param], interpret=True),
        step,
        dtype,
        sliding_window=window,
        logit_softcap=cap,
    )
    return request.param, step, output


def test_interpreted_kernel_matches_the_dense_reference(interpreted) -> None:
    dtype_name, step, output = interpreted
    *_, window, cap = SETTINGS[dtype_name]
    reference = dense_reference(step, STEP_LAYER, sliding_window=window, logit_softcap=cap)
    np.testing.assert_allclose(output, reference, atol=tolerance(reference, dtype_name), rtol=0)
    real = int(step.cu_q_lens[int(step.num_seqs)])
    assert not output[real:].any(), "padding tokens' outputs must be 0"


def test_interpreted_kernel_matches_the_cpu_paged_kernel(interpreted) -> None:
    """The engine's CPU kernel (``blocked``) on the same step through the same interface."""
    from halyard.models.attention import paged

    dtype_name, step, output = interpreted
    *_, window, cap = SETTINGS[dtype_name]
    cpu = run_kernel(
        paged.BlockedPagedKernel(), step, jnp.dtype(dtype_name), sliding_window=window, logit_softcap=cap
    )
    real = int(step.cu_q_lens[int(step.num_seqs)])
    reference = dense_reference(step, STEP_LAYER, sliding_window=window, logit_softcap=cap)
    bound = 2 * tolerance(reference, dtype_name)  # each within its bound of the exact values
    np.testing.assert_allclose(output[:real], cpu[:real], atol=bound, rtol=0)


EMPTY_SEQUENCE_STEPS = {  # (q_lens, kv_lens, page table rows) of the real sequences; the rest padding
    # the engine's warm-up step (`halyard.serve.runner.example_inputs`): num_seqs 0, every length 0
    "warm-up": ((), (), ()),
    # a sequence without tokens or keys before and after one that has both
    "empty around one": ((0, 3, 0), (0, 10, 0), ((5,), (2, 6), (9,))),
    # the first sequence fills query block 0 (4 tokens); the last has keys but no token
    "no token after a full query block": ((4, 0), (9, 5), ((1, 8), (3,))),
}
UNWAITED = "at kernel exit"
"""The TPU interpreter's report of a semaphore left nonzero (a DMA never waited for; on the chip: a halt)."""


def empty_sequences_step(name: str) -> RaggedStep:
    """`ragged_step`'s float32 keys and queries (4 query heads on 2 kv heads), every slot's keys in the pool
    beforehand, and the batch `EMPTY_SEQUENCE_STEPS` names (no new keys written)."""
    q_lens, kv_lens, rows = EMPTY_SEQUENCE_STEPS[name]
    table = np.zeros((SEQS, TABLE_WIDTH), np.int32)
    for index, row in enumerate(rows):
        table[index, : len(row)] = row
    step = ragged_step(np.float32)
    return dataclasses.replace(
        step,
        history_slots=np.arange(step.slot_keys.shape[1], dtype=np.int32),
        slots=np.full(step.slots.shape, -1, np.int32),
        page_table=table,
        cu_q_lens=np.cumsum([0, *q_lens, *[0] * (SEQS - len(q_lens))], dtype=np.int32),
        kv_lens=np.asarray([*kv_lens, *[0] * (SEQS - len(kv_lens))], np.int32),
        num_seqs=np.asarray(len(q_lens), np.int32),
    )


@pytest.mark.parametrize("name", sorted(EMPTY_SEQUENCE_STEPS))
def test_steps_with_empty_sequences_wait_for_every_page_copy(name, capfd) -> None:
    """Issue 53: the engine's warm-up halted the TPU ("Semaphore nonzero upon exit from Mosaic kernel").
    In the interpreter (DMAs eager) every page copy the kernel starts is waited for, and the values are
    the reference's (padding tokens 0)."""
    step = empty_sequences_step(name)
    kernel = PallasPagedKernel(*BLOCKS["float32"], interpret=True)
    output = run_kernel(kernel, step, np.float32, sliding_window=None, logit_softcap=None)
    assert UNWAITED not in capfd.readouterr().out
    reference = dense_reference(step, STEP_LAYER, sliding_window=None, logit_softcap=None)
    np.testing.assert_allclose(output, reference, atol=tolerance(reference, "float32"), rtol=0)


@pytest.mark.parametrize("name", sorted(EMPTY_SEQUENCE_STEPS))
def test_jaxs_kernel_given_these_steps_as_they_are_leaves_a_copy_unwaited(name, capfd, monkeypatch) -> None:
    """The same steps given to JAX's kernel unchanged (as before `kernel_sequences`): the interpreter
    reports a semaphore left nonzero, so the test above can see the fault it guards against."""

    def as_given(cu_q_lens, kv_lens, page_table, num_seqs):
        return kv_lens, page_table, cu_q_lens, jnp.reshape(num_seqs, (1,))

    monkeypatch.setattr(ragged_paged_pallas, "kernel_sequences", as_given)
    kernel = PallasPagedKernel(*BLOCKS["float32"], interpret=True)
    run_kernel(kernel, empty_sequences_step(name), np.float32, sliding_window=None, logit_softcap=None)
    assert UNWAITED in capfd.readouterr().out


def test_the_kernel_is_given_the_sequences_with_tokens_in_order_and_never_none() -> None:
    """`kernel_sequences` on random batches with empty sequences (q_len 0, kv_len 0, num_seqs 0): what the
    kernel's chain of page copies needs (module docstring), and the same tokens, keys and pages."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        num_seqs = int(rng.integers(0, 6))
        q_lens = rng.integers(0, 3, 6) * (np.arange(6) < num_seqs)
        kv_lens = np.where(q_lens > 0, q_lens + rng.integers(0, 9, 6), rng.integers(0, 2, 6) * 5)
        table = rng.integers(0, 40, (6, 3)).astype(np.int32)
        cu = np.cumsum([0, *q_lens]).astype(np.int32)
        given = kernel_sequences(
            jnp.asarray(cu), jnp.asarray(kv_lens, jnp.int32), jnp.asarray(table), num_seqs
        )
        kv, pages, cu_given, count = (np.asarray(part) for part in given)
        kept = np.flatnonzero(q_lens > 0)
        assert int(count[0]) == max(len(kept), 1)
        if len(kept):
            np.testing.assert_array_equal(kv[: len(kept)], kv_lens[kept])
            np.testing.assert_array_equal(pages[: len(kept)], table[kept])
            np.testing.assert_array_equal(cu_given[: len(kept) + 1], [*cu[kept], cu[-1]])
        else:  # the stand-in: one token (a padding one) over one key
            assert (kv[0], cu_given[1]) == (1, 1)


def test_the_models_paged_step_with_the_pallas_kernel_matches_the_full_forward(monkeypatch) -> None:
    """The engine's path: `CausalLM.paged_step` through the decoder's layer scan (a traced layer index, the
    pool in the carry) with the Pallas kernel interpreted, a prompt chunk then the rest, against the full
    forward (Mistral's shape: grouped-query attention, a sliding window of 4)."""

    from paged import paged_logits
    from tiny import random_tokens, tiny

    from halyard.models import init_model

    model = init_model(tiny("mistral"), jax.random.key(1))
    tokens = random_tokens(2, 11)
    full = np.asarray(jax.jit(lambda m, t: m(t))(model, tokens).unwrap("batch", "pos", "vocab"))
    init_pages = type(model).init_pages
    monkeypatch.setattr(
        type(model),
        "init_pages",
        lambda self, pages, size, implementation="pallas": init_pages(self, pages, size, "pallas"),
    )
    assert type(model.init_pages(4, 4).kernel).__name__ == "PallasPagedKernel"
    paged = paged_logits(model, tokens, [5, 11])
    terms = decoder_terms(model.model_config, tokens.axis_size("pos"))
    np.testing.assert_allclose(paged, full, atol=summation_tolerance(full, terms), rtol=0)


@pytest.mark.parametrize(
    "query_heads, kv_heads, dtype, words",
    [(4, 2, jnp.float16, "float32 or bfloat16"), (6, 4, jnp.float32, "multiple of kv heads")],
)
def test_shapes_the_kernel_cannot_run_get_one_line_errors(query_heads, kv_heads, dtype, words) -> None:
    reason = pallas_unsupported_reason(query_heads, kv_heads, dtype)
    assert reason is not None and words in reason and "\n" not in reason
    if dtype == jnp.float16:
        with pytest.raises(ValueError, match="init_pool"):
            PallasPagedKernel().init_pool(1, 2, 8, kv_heads, 64, dtype)
    assert pallas_unsupported_reason(9, 3, jnp.bfloat16) is None


@pytest.mark.parametrize(
    "kv_heads, head_size, dtype, expected",
    [  # (heads_per_row, rows, lanes)
        (2, 64, jnp.bfloat16, (2, 1, 128)),  # Qwen2.5-0.5B: both heads in one row
        (8, 64, jnp.bfloat16, (2, 4, 128)),  # Llama-3.2-1B
        (1, 64, jnp.float32, (1, 1, 128)),  # nothing to pack beside: lanes padded
        (3, 64, jnp.float32, (1, 4, 128)),  # SmolLM2-135M: 3 rows padded to 4
        (3, 64, jnp.bfloat16, (1, 4, 128)),
        (6, 64, jnp.bfloat16, (2, 4, 128)),  # 3 rows of two heads, padded to 4
        (8, 128, jnp.bfloat16, (1, 8, 128)),
        (2, 256, jnp.float32, (1, 2, 256)),
        (4, 32, jnp.float32, (4, 1, 128)),
        (2, 80, jnp.bfloat16, (1, 2, 128)),
    ],
)
def test_heads_fill_the_kernels_rows_and_lanes(kv_heads, head_size, dtype, expected) -> None:
    layout = RowLayout.for_heads(kv_heads, head_size, dtype)
    assert (layout.heads_per_row, layout.rows, layout.lanes) == expected


def test_query_groups_are_padded_to_groups_the_kernel_compiles() -> None:
    groups = (1, 2, 3, 4, 5, 7, 8, 9, 12, 14, 16)
    assert [padded_query_group(group) for group in groups] == [1, 2, 4, 4, 8, 8, 8, 16, 16, 16, 16]


def test_queries_placed_in_their_heads_lanes_come_back_to_their_heads() -> None:
    """`RowLayout.model_outputs` inverts `RowLayout.kernel_queries` exactly, and a query sits only in its
    own kv head's lanes (so its logits are its head's)."""
    layout = RowLayout.for_heads(6, 32, jnp.float32)  # 4 heads a row: rows of 2 real + 2 padded
    query = jnp.asarray(np.random.default_rng(0).normal(size=(3, 18, 32)), jnp.float32)
    placed = layout.kernel_queries(query)
    assert placed.shape == (3, layout.rows * padded_query_group(4 * 3), 128)
    np.testing.assert_array_equal(layout.model_outputs(placed, 18), query)
    # query head 7 is kv head 2 (group 3): row 0, slot 2 of the row, entry 1 of that head's group
    row = placed.reshape(3, layout.rows, -1, 4, 32)[:, 0, 2 * 3 + 1]
    np.testing.assert_array_equal(row[:, 2], query[:, 7])
    assert not np.asarray(row[:, [0, 1, 3]]).any()


def test_block_sizes_must_be_positive_ints() -> None:
    with pytest.raises(ValueError, match="num_queries_per_block"):
        PallasPagedKernel(num_queries_per_block=0)


CHIP_CHECK = """
import json, sys
sys.path[:0] = sys.argv[1:]
import jax, jax.numpy as jnp, numpy as np
from test_ragged_paged_pallas import run_kernel, tolerance
from ragged_case import STEP_LAYER, dense_reference, ragged_step
from halyard.models.attention.ragged_paged_pallas import PallasPagedKernel
results = {"backend": jax.default_backend()}
cases = [  # dtype, query heads, kv heads, window, cap, page size
    ("float32", 9, 3, 6, 2.0, 8), ("bfloat16", 9, 3, 6, 2.0, 8), ("bfloat16", 4, 2, None, None, 16),
    ("bfloat16", 14, 2, None, None, 64), ("float32", 4, 2, 6, None, 64), ("bfloat16", 8, 1, None, 3.0, 16),
]
for (dtype_name, query_heads, kv_heads, window, cap, page_size), by_token in zip(cases * 2, ["never"] * 6 + ["always"] * 6):
    step = ragged_step(jnp.dtype(dtype_name), query_heads, kv_heads, page_size)
    output = run_kernel(PallasPagedKernel(by_token=by_token), step, jnp.dtype(dtype_name),
                        sliding_window=window, logit_softcap=cap)
    reference = dense_reference(step, STEP_LAYER, sliding_window=window, logit_softcap=cap)
    case = f"{dtype_name} {query_heads}/{kv_heads} heads window={window} cap={cap} page_size={page_size} {by_token}"
    results[case] = (
        float(np.max(np.abs(output - reference))), tolerance(reference, "bfloat16"))
print(json.dumps(results))
"""


@pytest.mark.tpu
def test_compiled_kernel_on_the_chip_matches_the_reference() -> None:
    """The kernel compiled for the TPU (not interpreted), JAX's and the token kernel
    (`halyard.models.attention.paged_decode_pallas`), in a process of its own that holds the chip, at
    the bfloat16 tolerance (a TPU's float32 matmuls may take bfloat16 passes). ``HALYARD_TEST_TPU=1
    HALYARD_TEST_TPU_PLATFORMS=cpu`` rehearses it on a CPU, interpreted."""
    here = Path(__file__).parent
    support = here.parents[2] / "tests" / "support"
    platforms = os.environ.get("HALYARD_TEST_TPU_PLATFORMS", "tpu")
    env = dict(os.environ, JAX_PLATFORMS=platforms, XLA_FLAGS="")
    result = subprocess.run(
        [sys.executable, "-c", CHIP_CHECK, str(here), str(support)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results.pop("backend") == platforms.split(",")[0]
    for case, (error, bound) in results.items():
        assert error <= bound, f"{case}: largest difference {error:.3g} over the bound {bound:.3g}"


def test_a_block_of_pages_fits_the_vmem_budget_as_the_tpu_tiles_it() -> None:
    # 2 kv heads in bfloat16: 4 combined rows take a 16-row tile; a page of 16 is 16 x 16 x 128 x 2 bytes
    assert kv_pages_in_vmem(16, 4, 128, jnp.bfloat16, 8 * 2**20) == 8 * 2**20 // (2 * 16 * 16 * 128 * 2)
    assert kv_pages_in_vmem(64, 16, 128, jnp.float32, 8 * 2**20) == 8 * 2**20 // (2 * 64 * 16 * 128 * 4)
    assert kv_pages_in_vmem(256, 16, 256, jnp.float32, 1) == 1


def test_write_stores_interleaved_keys_and_values_in_the_layers_slots_only() -> None:
    """The pool in the kernel's layout after one write: each real token's two kv heads side by side in the
    lanes of row 0 (keys) and row 1 (values) of its slot in that layer; padding tokens (-1) stored nowhere."""
    step = ragged_step(np.float32)
    kernel = PallasPagedKernel()
    keys, values = step.step_keys(STEP_LAYER)
    pool = kernel.init_pool(LAYERS, PAGES, step.page_size, KV_HEADS, HEAD_SIZE, np.float32)
    assert pool.layout.heads_per_row == 2 and KV_HEADS * HEAD_SIZE == 128
    written = jax.jit(kernel.write)(
        pool, jnp.int32(STEP_LAYER), jnp.asarray(keys), jnp.asarray(values), jnp.asarray(step.slots)
    )
    assert written.pages.axis_names == POOL_AXES and written.layout == pool.layout
    expected = np.zeros(written.pages.array.shape, np.float32).reshape(LAYERS, -1, 2, 128)
    real = step.slots >= 0
    expected[STEP_LAYER, step.slots[real], 0] = keys[real].reshape(-1, 128)
    expected[STEP_LAYER, step.slots[real], 1] = values[real].reshape(-1, 128)
    np.testing.assert_array_equal(np.asarray(written.pages.array).reshape(expected.shape), expected)


def test_a_decode_program_gets_blocks_of_eight_queries_and_a_sequences_pages_in_one_copy() -> None:
    # 128 rows of one token each over 8 pages: a block brings all 8 (4 when only 4 fit), 8 queries a block
    assert decode_blocks(128, 128, 8, 8) == (8, 8)
    assert decode_blocks(128, 128, 8, 4) == (4, 8)
    assert decode_blocks(8 * 16, 16, 3, 8) == (3, 8)  # 8 tokens a sequence on average: still decode
    assert decode_blocks(8 * 16 + 1, 16, 3, 8) is None  # more: a prefill program, JAX's table decides
    assert decode_blocks(1, 1, 8, 0) == (1, 8)  # a page a block at least


def test_the_compiled_kernels_blocks_for_a_decode_program_come_from_decode_blocks() -> None:
    # what attend gives the kernel on a TPU (interpret=False), for 128 rows of one token over 8 pages of 256
    kernel = PallasPagedKernel()
    pool = kernel.init_pool(1, 1024, 256, 2, 64, jnp.bfloat16)
    queries = jnp.zeros((128, 14, 128), jnp.bfloat16)
    fit = kv_pages_in_vmem(
        *pool.pages.array.shape[2:], jnp.bfloat16, ragged_paged_pallas.DECODE_KV_BUFFER_BYTES
    )
    assert (
        kernel._blocks(queries, pool, (128, 8), interpret=False) == decode_blocks(128, 128, 8, fit) == (8, 8)
    )
    assert PallasPagedKernel(2, 16)._blocks(queries, pool, (128, 8), interpret=False) == (
        2,
        16,
    )  # given: kept
