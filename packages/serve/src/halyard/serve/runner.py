"""`ModelRunner`: the compiled programs of an engine step, over the model's own forward and a page pool.

One program runs ``rows`` sequences of ``tokens`` new tokens each against their pages: the family's
`CausalLM.paged_step` (its decoder, with the training attention kernel over each row's pages), then, per
row, the logits of one chosen token and the next token drawn from them (`halyard.serve.sampler`), and
optionally the log-probability of every fed token's successor (prompt log-probs). The shapes come from a
small fixed set: ``tokens`` is 1 (decoding rows) or the chunk size (prefill rows); ``rows`` and the number
of pages a row can read (``seq_pages``) are rounded up to powers of two, so a long-running engine compiles
each shape once and never again (`ModelRunner.compiled_shapes`, ``programs_compiled``, ``compile_seconds``;
`ModelRunner.shape_set` lists every shape an engine can ask for, which `halyard.serve.warmup` compiles at
start). In
deterministic mode (``fixed_rows``) a program has fewer rows than the most asked for only where
`halyard.serve.row_check` showed that it computes every row as the full-size program does.

A step program only reads the pool; a second small program, to which the pool is donated, stores the
step's new keys and values in place (a program that read and wrote the pool would copy all of it). It is
given only the few pages each row writes (`store_window`), so it compiles once per ``(rows, tokens)``, not
once per page bucket as well.

With ``invariant`` (`EngineConfig.training_arithmetic`) the programs are traced inside
`halyard.named.nn.batch_invariant`: in a process without
fused multiply-adds (`halyard.named.nn.unfuse_multiply_add`) a row's numbers are then those of the same row
in a training forward pass traced inside `batch_invariant` (``trainer.objective: grpo``), bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import CausalLM
from halyard.models.layers.paged_kv import PagedKV
from halyard.named import named
from halyard.named.nn import batch_invariant, row_log_softmax
from halyard.serve.compile_events import thread_compiles
from halyard.serve.params import MAX_TOP_LOGPROBS
from halyard.serve.program import ProgramShape, StepInputs, StepOutputs, round_up_power_of_two
from halyard.serve.row_check import first_rows, probe_inputs, results_agree
from halyard.serve.sampler import RowSettings, draw
from halyard.shard import Layout, use_layout


class ModelRunner:
    """Holds the model, the page pool and the compiled step programs.

    Args:
        model: the model (its parameters already on the devices they should live on).
        num_pages: pages in the pool.
        page_size: tokens per page.
        max_seq_pages: the most pages one sequence may hold (its context divided by ``page_size``).
        min_rows: the smallest row count a program is compiled for (row counts are powers of two from it,
            up to the largest asked for).
        fixed_rows: deterministic mode: a program has the most rows asked for (``max_rows`` of `shape_for`),
            or fewer only where `rows_agree` showed that fewer rows give every row the same bits.
        invariant: trace the programs inside `batch_invariant` (see the module docstring).
        mesh, layout: run the programs with this activation layout and place the pool by it (both or
            neither; the model's parameters should already be placed by the same layout).
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        num_pages: int,
        page_size: int,
        max_seq_pages: int,
        min_rows: int = 1,
        fixed_rows: bool = False,
        invariant: bool = False,
        mesh: jax.sharding.Mesh | None = None,
        layout: Layout | None = None,
    ):
        if (mesh is None) != (layout is None):
            raise ValueError("ModelRunner takes a mesh and a layout together, or neither")
        self.model = model
        self.page_size = page_size
        self.max_seq_pages = max_seq_pages
        self.min_rows = min_rows
        self.fixed_rows = fixed_rows
        self.invariant = invariant
        self.mesh, self.layout = mesh, layout
        pages = model.init_pages(num_pages, page_size)
        if mesh is not None and layout is not None:
            pages = jax.device_put(pages, layout.shardings(pages, mesh))
        self.pages = pages
        self.vocab_size = model.unembedding.axis_size("vocab")
        self.compile_seconds = 0.0
        self.programs_compiled = 0
        self.row_checks: dict[ProgramShape, bool] = {}
        self._programs: dict[ProgramShape, Any] = {}

    @property
    def compiled_shapes(self) -> list[ProgramShape]:
        """Every shape compiled so far."""
        return list(self._programs)

    def shape_for(
        self, rows: int, max_rows: int, tokens: int, seq_pages: int, prompt_logprobs: bool
    ) -> ProgramShape:
        """The program shape that holds ``rows`` rows (of at most ``max_rows``) of ``tokens`` tokens reading
        ``seq_pages`` pages: rows rounded up to a power of two from ``min_rows``; with ``fixed_rows``, the
        smallest such count whose program computes every row as the ``max_rows`` program does
        (`rows_agree`), else ``max_rows``."""
        pages = min(round_up_power_of_two(seq_pages), self.max_seq_pages)
        size = min(round_up_power_of_two(rows, self.min_rows), max_rows)
        while self.fixed_rows and size < max_rows:
            shape = ProgramShape(size, tokens, pages, prompt_logprobs)
            if self.rows_agree(shape, max_rows):
                return shape
            size = min(size * 2, max_rows)
        return ProgramShape(size, tokens, pages, prompt_logprobs)

    def shape_set(self, max_rows: int, tokens: int) -> list[ProgramShape]:
        """Every shape `shape_for` can give programs of at most ``max_rows`` rows of ``tokens`` tokens without
        prompt log-probs: one per row bucket and page bucket (in deterministic mode this runs the row
        checks, compiling what they need)."""
        shapes: dict[ProgramShape, None] = {}
        for rows in _buckets(self.min_rows, max_rows):
            for pages in _buckets(1, self.max_seq_pages):
                shapes[self.shape_for(rows, max_rows, tokens, pages, prompt_logprobs=False)] = None
        return list(shapes)

    def rows_agree(self, shape: ProgramShape, max_rows: int) -> bool:
        """Whether ``shape``'s program gives every row the bits the ``max_rows`` program of the same shape gives
        it (`halyard.serve.row_check`; checked once per shape, when first asked, and kept in
        ``row_checks``)."""
        if shape in self.row_checks:
            return self.row_checks[shape]
        disagreed = {(s.rows, s.tokens) for s, agrees in self.row_checks.items() if not agrees}
        if (shape.rows, shape.tokens) in disagreed:
            return False  # this many rows disagreed over other pages: taken to disagree here too (safe)
        full = dataclasses.replace(shape, rows=max_rows)
        probe = probe_inputs(full, self.page_size, self.pages.key_pages.axis_size("page"), self.vocab_size)
        small = self._results(shape, first_rows(probe, shape.rows))
        self.row_checks[shape] = results_agree(small, self._results(full, probe), shape.rows)
        return self.row_checks[shape]

    def _results(self, shape: ProgramShape, inputs: StepInputs) -> tuple:
        """What ``shape``'s program computes for ``inputs``: ``(the keys and values it would store, its
        outputs)``, storing nothing."""
        program, _ = self._program(shape)
        with self._placement():
            return program(self.model, self.pages, jax.tree.map(self._placed, inputs))

    def run(self, shape: ProgramShape, inputs: StepInputs) -> StepOutputs:
        """Run one program on ``inputs`` (already padded to ``shape``) and store the new keys and values."""
        program, store = self._program(shape)
        device_inputs = jax.tree.map(self._placed, inputs)
        window, window_positions = store_window(inputs.page_table, inputs.positions, self.page_size)
        with self._placement():
            written, outputs = program(self.model, self.pages, device_inputs)
            started, compiles = time.perf_counter(), thread_compiles()
            self.pages = store(self.pages, written, self._placed(window), self._placed(window_positions))
            if thread_compiles() > compiles:  # this call compiled it (the call itself only dispatches)
                self.compile_seconds += time.perf_counter() - started
                self.programs_compiled += 1
        values: list[Any] = [None if value is None else np.asarray(value) for value in outputs]
        return StepOutputs(*values)

    def _placed(self, value: np.ndarray) -> jax.Array:
        """A host input as the programs take it: on the default device, or replicated over the mesh (every
        process of a multi-process run holds the same inputs: the scheduler's decisions are deterministic)."""
        if self.mesh is None:
            return jax.device_put(value)  # jnp.asarray would compile a small program per shape and dtype
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        return jax.make_array_from_process_local_data(replicated, np.asarray(value))

    def _placement(self) -> Any:
        if self.mesh is None or self.layout is None:
            return contextlib.nullcontext()
        return use_layout(self.layout, self.mesh)

    def _program(self, shape: ProgramShape) -> tuple[Any, Any]:
        """The step program of ``shape`` (it only reads the pool) and the program that stores the step's keys
        and values in the pool (donated: stored in place; compiled at its first call)."""
        programs = self._programs.get(shape)
        if programs is not None:
            return programs
        started, compiles = time.perf_counter(), thread_compiles()
        example = jax.tree.map(self._placed, example_inputs(shape, self.page_size))
        with self._placement():
            lowered = jax.jit(_step, static_argnames="invariant").lower(
                self.model, self.pages, example, invariant=self.invariant
            )
            compiled = lowered.compile()
        self.compile_seconds += time.perf_counter() - started
        self.programs_compiled += (
            thread_compiles() - compiles
        )  # 0 when JAX had it (this process, the disk cache)
        self._programs[shape] = (compiled, _store)
        return compiled, _store


def store_window(
    page_table: np.ndarray, positions: np.ndarray, page_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The pages each row writes and its positions within them: ``(table [rows, width], positions [rows,
    tokens])``, ``width`` the most pages ``tokens`` consecutive positions can touch. Row ``r``'s window starts
    at the page of its first fed position; positions shift by as many whole pages (the same page and slot
    for every token), padding (-1) stays padding.

    Args:
        page_table: int32 ``[rows, seq_pages]``: each row's pages.
        positions: int32 ``[rows, tokens]``: each fed token's position, -1 for padding.
        page_size: tokens per page.
    """
    tokens = positions.shape[1]
    width = -(-tokens // page_size) + 1
    fed = positions >= 0
    first = np.where(fed.any(axis=1), np.where(fed, positions, np.iinfo(np.int32).max).min(axis=1), 0)
    first_page = first // page_size
    pages = first_page[:, None] + np.arange(width)[None, :]
    inside = pages < page_table.shape[1]
    window = np.where(
        inside, np.take_along_axis(page_table, np.minimum(pages, page_table.shape[1] - 1), 1), 0
    )
    shifted = np.where(fed, positions - (first_page * page_size)[:, None], -1)
    return window.astype(np.int32), shifted.astype(np.int32)


def _buckets(smallest: int, largest: int) -> list[int]:
    """The sizes `round_up_power_of_two` gives from ``smallest`` (``smallest`` times powers of two) below
    ``largest``, then ``largest``."""
    sizes = []
    size = round_up_power_of_two(1, smallest)
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


def example_inputs(shape: ProgramShape, page_size: int) -> StepInputs:
    """Inputs of ``shape`` that are all padding: a program run on them stores nothing."""
    rows, tokens = shape.rows, shape.tokens
    int_rows = np.zeros((rows,), np.int32)
    settings = RowSettings(
        temperature=np.zeros((rows,), np.float32),
        top_k=int_rows,
        top_p=np.ones((rows,), np.float32),
        min_p=np.zeros((rows,), np.float32),
        seed=np.zeros((rows, 2), np.uint32),
        sample=int_rows,
        position=int_rows,
    )
    return StepInputs(
        tokens=np.zeros((rows, tokens), np.int32),
        positions=np.full((rows, tokens), -1, np.int32),
        page_table=np.zeros((rows, shape.seq_pages), np.int32),
        last=int_rows,
        settings=settings,
        next_tokens=np.zeros((rows, tokens), np.int32) if shape.prompt_logprobs else None,
    )


def _rows(pages: PagedKV, page_table: Any, positions: Any) -> PagedKV:
    """The pool with the rows of a call (padding tokens, position -1, are written nowhere)."""
    capacity = page_table.shape[1] * pages.page_size
    return pages.for_rows(page_table, jnp.where(positions >= 0, positions, capacity))


@functools.partial(jax.jit, donate_argnums=(0,))
def _store(pages: PagedKV, written: tuple, page_table: jax.Array, positions: jax.Array) -> PagedKV:
    """Store a step's new keys and values in their pages (the pool donated: in place)."""
    return _rows(pages, page_table, positions).written(*written).without_rows()


def _step(model: CausalLM, pages: PagedKV, inputs: StepInputs, invariant: bool) -> tuple[tuple, tuple]:
    with batch_invariant() if invariant else contextlib.nullcontext():
        return _step_body(model, pages, inputs)


def _step_body(model: CausalLM, pages: PagedKV, inputs: StepInputs) -> tuple[tuple, tuple]:
    rows = inputs.tokens.shape[0]
    pages = _rows(pages, inputs.page_table, inputs.positions)
    tokens = named(inputs.tokens, ("batch", "pos"))
    positions = named(inputs.positions, ("batch", "pos"))
    hidden, written = model.paged_step(tokens, positions=positions, pages=pages)
    compute = model.in_compute_dtype()
    plain = hidden.rearrange("batch", "pos", "embed")
    chosen = plain.array[jnp.arange(rows), inputs.last]
    logits = compute.logits(named(chosen, ("batch", "embed"))).unwrap("batch", "vocab")
    num_top = min(MAX_TOP_LOGPROBS, logits.shape[-1])  # a vocabulary smaller than 20 has fewer alternatives
    drawn = draw(logits, inputs.settings, num_top)
    prompt: tuple = (None, None, None)
    if inputs.next_tokens is not None:
        all_logits = compute.logits(plain).unwrap("batch", "pos", "vocab")
        logprobs = row_log_softmax(all_logits)
        targets = jnp.clip(inputs.next_tokens, 0, logprobs.shape[-1] - 1)
        next_logprob = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
        next_logprob = jnp.where(inputs.next_tokens >= 0, next_logprob, 0.0)
        top_logprobs, top_tokens = jax.lax.top_k(logprobs, num_top)
        prompt = (next_logprob, top_tokens.astype(jnp.int32), top_logprobs)
    return written, (*drawn, *prompt)
