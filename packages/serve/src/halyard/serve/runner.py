"""`ModelRunner`: the compiled program of an engine step, over the model's own forward and a page pool.

One program runs a flat batch of ``tokens`` tokens of at most ``seqs`` sequences (decoding sequences and
prefill chunks side by side, `halyard.models.attention.ragged_paged`) against their pages: the family's
`CausalLM.paged_step` (its decoder; each layer stores the step's keys and values in the pool, which is
donated to the program and so written in place, then the paged kernel attends), then, per sequence, the
logits of its last token and the next token drawn from them (`halyard.serve.sampler`), and optionally the
top alternatives of the drawn tokens and the log-probability of every fed token's successor (prompt
log-probs). The shapes come from a small fixed set: ``tokens`` is rounded up to a bucket (`token_ladder`'s, or
one of ``token_buckets``; at most the most one program holds), ``seqs`` follows it, and the pages a
sequence can read (``seq_pages``) are rounded up to powers of two, so a long-running engine compiles each shape once and never again
(`ModelRunner.compiled_shapes`, ``programs_compiled``, ``programs_loaded``, ``compile_seconds``; `ModelRunner.shape_set` lists
every shape, with or without the log-prob variants, which `halyard.serve.warmup` compiles at start, several
at once: `ModelRunner.compile_shapes`).

With ``invariant`` (deterministic mode) the programs are traced inside `halyard.named.nn.batch_invariant`:
every product over tokens runs in blocks of the same row count whatever the program's size (one compiled
``[32, k] x [k, o]`` dot in a loop), the row sums of the norms, the softmaxes and the attention kernel's
pages are in a fixed order, and attention folds a token's keys page by page in position order
(`halyard.models.attention.paged`). A token's numbers then do not depend on the other tokens of its program,
on how many there are, or on where it sits, so every program size gives a sequence the same bits (the row
checks of `halyard.serve.row_check` compare them in the tests). In a process without fused multiply-adds
(`halyard.named.nn.unfuse_multiply_add`) they are also those of the same token in a training forward pass
traced inside `batch_invariant` (``trainer.objective: grpo``), bit for bit.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import CausalLM
from halyard.models.layers.paged_kv import PagedKV
from halyard.named import NamedArray, named
from halyard.named.nn import batch_invariant, row_log_softmax
from halyard.serve.adapters import adapter_count, with_rows
from halyard.serve.compile_events import thread_compiles
from halyard.serve.packed_inputs import Packing, pack, unpack
from halyard.serve.params import MAX_TOP_LOGPROBS
from halyard.serve.program import (
    ProgramShape,
    StepInputs,
    StepOutputs,
    doubling_sizes,
    example_inputs,
    mask_words,
    round_up_power_of_two,
    token_ladder,
)
from halyard.serve.program_store import ProgramStore
from halyard.serve.sampler import Drawn, draw, repeated_rows
from halyard.shard import Layout, use_layout


class ModelRunner:
    """Holds the model, the KV page pool (``paged_kv``, on the device; which sequence owns which page is the
    engine's `PageAllocator`) and the compiled step programs.

    Args:
        model: the model (its parameters already on the devices they should live on).
        num_pages: pages in the pool.
        page_size: tokens per page.
        max_seq_pages: the most pages one sequence may hold (its context divided by ``page_size``).
        max_tokens: the most tokens of one program.
        max_seqs: the most sequences of one program.
        min_tokens: the smallest token count a program is compiled for (token counts are `token_ladder`'s
            from it).
        token_buckets: the token counts of programs below ``max_tokens``, ascending, instead of
            ``min_tokens``' ladder (empty: that).
        invariant: deterministic mode: trace the programs inside `batch_invariant` (see the module
            docstring).
        kernel: the paged attention kernel (`halyard.models.attention.dispatch.paged_kernel`).
        mesh, layout: run the programs with this activation layout and place the pool by it (both or
            neither; the model's parameters should already be placed by the same layout).
        program_store: keep the programs' lowerings there and read them back instead of tracing the model
            (`halyard.serve.program_store`; a runner without a mesh only).
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        num_pages: int,
        page_size: int,
        max_seq_pages: int,
        max_tokens: int,
        max_seqs: int,
        min_tokens: int = 1,
        token_buckets: Sequence[int] = (),
        invariant: bool = False,
        kernel: str = "auto",
        mesh: jax.sharding.Mesh | None = None,
        layout: Layout | None = None,
        program_store: ProgramStore | None = None,
    ):
        if (mesh is None) != (layout is None):
            raise ValueError("ModelRunner takes a mesh and a layout together, or neither")
        self.model = model
        self.num_pages = num_pages
        self.page_size = page_size
        self.max_seq_pages = max_seq_pages
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.min_tokens = min_tokens
        self.token_sizes = (
            [*(size for size in token_buckets if size < max_tokens), max_tokens]
            if token_buckets
            else token_ladder(min_tokens, max_tokens)
        )
        """The token counts of this runner's programs, ascending (the last is ``max_tokens``)."""
        self.invariant = invariant
        self.mesh, self.layout = mesh, layout
        pages = model.init_pages(num_pages, page_size, kernel)
        if mesh is not None and layout is not None:
            pages = jax.device_put(pages, layout.shardings(pages, mesh))
        self.paged_kv: PagedKV = pages
        self.vocab_size = model.unembedding.axis_size("vocab")
        self.adapters = adapter_count(model)
        """The LoRA adapters the model serves besides its base (`halyard.serve.adapters`; 0: none)."""
        self.compile_seconds = 0.0
        self.programs_compiled = 0
        self.programs_loaded = 0  # read from the persistent compilation cache instead
        self.programs_traced = 0  # the rest were lowered from `program_store`
        self.program_store = program_store if mesh is None else None
        self._programs: dict[ProgramShape, tuple[Any, Packing]] = {}
        self._counting = threading.Lock()  # `compile_shapes`' threads add to the counters

    @property
    def compiled_shapes(self) -> list[ProgramShape]:
        """Every shape compiled so far."""
        return list(self._programs)

    def bucket(self, tokens: int) -> int:
        """The tokens of the smallest program a step of ``tokens`` tokens can run in: the smallest of
        ``token_sizes`` that holds them (``max_tokens`` for more)."""
        return next((size for size in self.token_sizes if size >= tokens), self.max_tokens)

    def shape_for(
        self,
        tokens: int,
        seq_pages: int,
        *,
        prompt_logprobs: bool = False,
        alternatives: bool = False,
        adjusted: bool = False,
        draws: int = 1,
        adapters: bool = False,
    ) -> ProgramShape:
        """The program shape that holds ``tokens`` tokens reading ``seq_pages`` pages: tokens rounded up to the
        next of ``token_sizes``, pages to a power of two. ``adjusted``: a program that takes grammar masks and
        logit biases (`halyard.serve.sampler.LogitAdjustments`); ``draws``: tokens drawn per row
        (`ProgramShape.draws`); ``adapters``: one that runs the model's LoRA adapters (`StepInputs.adapters`)."""
        pages = min(round_up_power_of_two(seq_pages), self.max_seq_pages)
        words = mask_words(self.vocab_size) if adjusted else 0
        return self._shape(self.bucket(tokens), pages, prompt_logprobs, alternatives, words, draws, adapters)

    def _shape(
        self,
        tokens: int,
        pages: int,
        prompt_logprobs: bool,
        alternatives: bool,
        mask_words: int = 0,
        draws: int = 1,
        adapters: bool = False,
    ) -> ProgramShape:
        return ProgramShape(
            tokens,
            min(tokens, self.max_seqs),
            pages,
            prompt_logprobs,
            alternatives,
            mask_words,
            draws,
            adapters,
        )

    def bucket_shapes(self, *, logprob_variants: bool = False) -> list[ProgramShape]:
        """One shape per token bucket and page bucket (each one's log-prob variants too with
        ``logprob_variants``): every shape `shape_for` can give without grammar masks."""
        variants = [(False, False), (False, True), (True, False), (True, True)]
        return [
            self._shape(tokens, pages, prompt_logprobs, alternatives)
            for prompt_logprobs, alternatives in (variants if logprob_variants else variants[:1])
            for tokens in self.token_sizes
            for pages in doubling_sizes(1, self.max_seq_pages)
        ]

    def shape_set(self, *, logprob_variants: bool = False) -> list[ProgramShape]:
        """Every shape `shape_for` can give without log-prob extras (`bucket_shapes`); with
        ``logprob_variants``, also each one's variants with prompt log-probs, top alternatives or both."""
        return self.bucket_shapes(logprob_variants=logprob_variants)

    def compile_shapes(
        self, shapes: Sequence[ProgramShape], threads: int
    ) -> Iterator[tuple[ProgramShape, float]]:
        """Compile the programs of ``shapes`` not compiled yet, ``threads`` at a time (XLA compiles outside
        Python's lock, so a machine's cores compile side by side), yielding ``(shape, seconds)`` as each
        finishes. ``compile_seconds`` grows by the wall time of the whole, not the sum of the threads'."""
        todo = [shape for shape in dict.fromkeys(shapes) if shape not in self._programs]
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(todo) or 1))) as pool:
            # Each thread traces in a copy of the caller's context (`compiling_for`, `batch_invariant`'s rows).
            futures = {
                pool.submit(contextvars.copy_context().run, self._compile, shape): shape for shape in todo
            }
            for future in concurrent.futures.as_completed(futures):
                compiled, counts, seconds = future.result()
                with self._counting:
                    self._count(counts)
                    self._programs.setdefault(futures[future], compiled)
                yield futures[future], seconds
        with self._counting:
            self.compile_seconds += time.perf_counter() - started

    def _count(self, counts: tuple[int, int, int]) -> None:
        """Add one program's (compiled, loaded, traced) counts (`_compile`; under ``_counting``)."""
        compiled, loaded, traced = counts
        self.programs_compiled += compiled  # 0 when JAX had it (this process, the disk cache)
        self.programs_loaded += loaded
        self.programs_traced += traced

    def results(self, shape: ProgramShape, inputs: StepInputs, pages: Sequence[np.ndarray]) -> tuple:
        """What ``shape``'s program computes for ``inputs`` from a copy of the pool: ``(the pool's arrays at
        each of ``pages`` after it, its outputs)``; the engine's pool is left as it was (the row checks of
        `halyard.serve.row_check` compare programs with it)."""
        with self._placement():
            copy = jax.tree.map(jnp.copy, self.paged_kv)
            stored, outputs = self._call(shape, copy, self._fed_nothing(inputs, shape))
            return [written_pages(stored.pool, self._placed(chosen)) for chosen in pages], outputs

    def run(self, shape: ProgramShape, inputs: StepInputs) -> StepOutputs:
        """Dispatch one program on ``inputs`` (already padded to ``shape``); the pool is updated in place.
        The outputs stay on the device (their copy to the host starts when the program ends; `fetched`
        waits for it)."""
        with self._placement():
            self.paged_kv, outputs = self._call(shape, self.paged_kv, inputs)
        for output in outputs[:-1]:  # not padded_token: the next program's input, never on the host
            if output is not None:
                output.copy_to_host_async()  # the transfer starts as soon as the program ends
        return outputs

    def _call(self, shape: ProgramShape, pages: PagedKV, inputs: StepInputs) -> tuple[PagedKV, StepOutputs]:
        """``shape``'s program on ``pages`` and ``inputs``, sent as one buffer (`halyard.serve.packed_inputs`)."""
        program, packing = self._program(shape)
        buffer, previous, packed = pack(inputs)
        if packed != packing:
            raise ValueError(
                f"step inputs {packed.arrays} do not match the arrays {packing.arrays} the program of {shape} takes"
            )
        return program(self.model, pages, self._placed(buffer), self._placed(previous))

    def _placed(self, value: np.ndarray | jax.Array) -> jax.Array:
        """An input as the programs take it: on the default device, or replicated over the mesh (every
        process of a multi-process run holds the same inputs: the scheduler's decisions are deterministic).
        A device array (a pipelined step's ``previous`` tokens) stays on the devices."""
        if self.mesh is None:
            if isinstance(value, jax.Array):
                return value  # already where this runner's programs put their outputs
            return jax.device_put(value)  # jnp.asarray would compile a small program per shape and dtype
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        if isinstance(value, jax.Array):
            return (
                value
                if value.sharding.is_equivalent_to(replicated, value.ndim)
                else jax.device_put(value, replicated)
            )
        return jax.make_array_from_process_local_data(replicated, np.asarray(value))

    def _placement(self) -> Any:
        if self.mesh is None or self.layout is None:
            return contextlib.nullcontext()
        return use_layout(self.layout, self.mesh)

    def _program(self, shape: ProgramShape) -> tuple[Any, Packing]:
        """The step program of ``shape`` and the packing of its inputs (compiled at its first use; the pool is
        donated to it)."""
        program = self._programs.get(shape)
        if program is not None:
            return program
        compiled, counts, seconds = self._compile(shape)
        with self._counting:
            self.compile_seconds += seconds
            self._count(counts)
            return self._programs.setdefault(shape, compiled)

    def _compile(self, shape: ProgramShape) -> tuple[tuple[Any, Packing], tuple[int, int, int], float]:
        """``shape``'s program compiled with the packing of its inputs; the XLA compiles that took, the
        programs read from the persistent cache (both 0 when this process had it) and whether it was traced
        (not read from `program_store`); the seconds."""
        started, (compiles, loads) = time.perf_counter(), thread_compiles()
        buffer, previous, packing = pack(self.example_inputs(shape))
        arguments = (self.model, self.paged_kv, self._placed(buffer), self._placed(previous))
        static = dict(
            packing=packing, invariant=self.invariant, alternatives=shape.alternatives, draws=shape.draws
        )
        with self._placement():
            compiled: Any
            if self.program_store is None:
                step = jax.jit(_step, static_argnames=tuple(static), donate_argnums=(1,))
                compiled, traced = step.lower(*arguments, **static).compile(), True
            else:
                compiled, traced = self.program_store.compile(
                    _step, arguments, static, (1,), self._output_tree
                )
        compiled_now, loaded_now = thread_compiles()
        return (
            (compiled, packing),
            (compiled_now - compiles, loaded_now - loads, int(traced)),
            time.perf_counter() - started,
        )

    def _output_tree(self, present: list[bool]) -> Any:
        """The tree of a step's outputs (the pool, `StepOutputs`) whose leaves are ``present`` (flattened with
        None as a leaf: `halyard.serve.program_store.ProgramStore.compile`)."""
        pool = len(jax.tree.leaves(self.paged_kv, is_leaf=lambda leaf: leaf is None))
        fields = present[pool:]
        if len(fields) != len(StepOutputs._fields):
            raise ValueError(
                f"a stored step program has {len(present)} outputs; this runner's have {pool + len(StepOutputs._fields)}"
            )
        return jax.tree.structure((self.paged_kv, StepOutputs(*(0 if field else None for field in fields))))

    def example_inputs(self, shape: ProgramShape) -> StepInputs:
        """Inputs of ``shape`` that are all padding, as this runner's programs take them."""
        return self._fed_nothing(example_inputs(shape), shape)

    def _fed_nothing(self, inputs: StepInputs, shape: ProgramShape) -> StepInputs:
        """``inputs`` taking no token from a previous program (every program takes ``fed_from`` and
        ``previous``: the engine dispatches a step before fetching the one before it), and in a program that
        runs adapters, each token's adapter when not given: ``token % (adapters + 1)`` (0 for padding; a row
        check's random tokens so mix the adapters, the same ones in the small and the full program)."""
        previous = np.zeros((self.max_seqs,), np.int32)
        inputs = inputs._replace(fed_from=np.full(inputs.tokens.shape, -1, np.int32), previous=previous)
        if shape.adapters and inputs.adapters is None:
            inputs = inputs._replace(adapters=(inputs.tokens % (self.adapters + 1)).astype(np.int32))
        return inputs


def fetched(outputs: StepOutputs) -> StepOutputs:
    """The outputs on the host (numpy), in one transfer; ``padded_token`` (the next program's input) stays on
    the device."""
    on_host: StepOutputs = jax.device_get(outputs._replace(padded_token=None))
    return on_host._replace(padded_token=outputs.padded_token)


def _step(
    model: CausalLM,
    pages: PagedKV,
    buffer: jax.Array,
    previous: jax.Array,
    packing: Packing,
    invariant: bool,
    alternatives: bool,
    draws: int = 1,
) -> tuple[PagedKV, StepOutputs]:
    with batch_invariant() if invariant else contextlib.nullcontext():
        return _step_body(model, pages, unpack(buffer, previous, packing), alternatives, draws)


def _step_body(
    model: CausalLM, pages: PagedKV, inputs: StepInputs, alternatives: bool, draws: int
) -> tuple[PagedKV, StepOutputs]:
    fed: Any = inputs.tokens
    if inputs.fed_from is not None:  # the previous program's tokens, without a trip to the host
        fed = jnp.where(inputs.fed_from >= 0, inputs.previous[jnp.maximum(inputs.fed_from, 0)], fed)
    tokens = named(fed, ("pos",))
    if inputs.adapters is not None:
        model = with_rows(model, named(inputs.adapters, ("pos",)))
    hidden, pages = model.paged_step(tokens, pages=pages.for_step(inputs.batch))
    compute = model.in_compute_dtype()
    plain = hidden.rearrange("pos", "embed")
    settings, adjustments, last = inputs.settings, inputs.adjustments, jnp.asarray(inputs.last)
    if draws > 1:  # each row draws after its last token and after each of the draws - 1 tokens fed after it
        settings, adjustments, last = repeated_rows(settings, adjustments, last, draws, plain.array.shape[0])
    chosen = plain.array[last]
    logits = compute.logits(named(chosen, ("batch", "embed"))).unwrap("batch", "vocab")
    num_top = min(MAX_TOP_LOGPROBS, logits.shape[-1])  # a vocabulary smaller than 20 has fewer alternatives
    drawn = draw(logits, settings, num_top if alternatives else 0, adjustments)
    if draws > 1:
        drawn = Drawn(
            *(x.reshape(-1, draws) for x in drawn[:3]),
            *(None if x is None else x.reshape(-1, draws, x.shape[-1]) for x in drawn[3:]),  # type: ignore[arg-type]
        )
    prompt: tuple = (None, None, None)
    if inputs.next_tokens is not None:
        all_logits = compute.logits(plain).unwrap("pos", "vocab")
        logprobs = row_log_softmax(all_logits)
        targets = jnp.clip(inputs.next_tokens, 0, logprobs.shape[-1] - 1)
        next_logprob = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
        next_logprob = jnp.where(inputs.next_tokens >= 0, next_logprob, 0.0)
        top_logprobs, top_tokens = jax.lax.top_k(logprobs, num_top)
        prompt = (next_logprob, top_tokens.astype(jnp.int32), top_logprobs)
    outputs = StepOutputs(*drawn, *prompt)
    if inputs.previous is not None:
        token = outputs.token if draws == 1 else outputs.token[:, 0]
        padded = jnp.zeros_like(inputs.previous).at[: token.shape[0]].set(token)
        outputs = outputs._replace(padded_token=padded)
    return pages.without_step(), outputs


def written_pages(pool: object, pages: jax.Array) -> list[jax.Array]:
    """Each of the pool's arrays at ``pages`` (along its ``page`` axis), for comparing two programs'
    stores."""
    leaves = jax.tree.leaves(pool, is_leaf=lambda x: isinstance(x, NamedArray))
    return [_take_pages(leaf.array, pages, leaf.axis_names.index("page")) for leaf in leaves]


@functools.partial(jax.jit, static_argnums=(2,))
def _take_pages(array: jax.Array, pages: jax.Array, axis: int) -> jax.Array:
    return jnp.take(array, pages, axis=axis)
