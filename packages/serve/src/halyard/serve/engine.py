"""`Engine`: continuous batching over a paged KV cache: requests join the running batch at the next step
and leave when they finish, long prompts are prefilled in chunks beside the decoding rows, and pages are
shared between samples and common prefixes and freed the moment a sequence ends.

One step: the `Scheduler` picks the work, `batching` lays it out as one flat batch (decoding sequences
and prefill chunks side by side), the `ModelRunner` runs it as one compiled program (in deterministic mode
with ``deterministic_rows`` set, one per that many sequences, all dispatched before any result is fetched),
and each request folds in what its sequences drew (`RequestState`), ending samples on a stop token, at
``max_tokens``, or when cancelled. The text of the new tokens and the stop strings are a `Detokenizer`'s: `step` runs one by
default; a server hands it off (`hand_off_text`) to run beside its event loop, off the engine's thread.

A step of one program is pipelined: `step` schedules and dispatches step k+1 while step k runs, then
fetches step k's tokens. Step k+1 is scheduled before they are known: each token step k draws holds a
`PLACEHOLDER` in its sequence, and the programs of step k+1 take it from step k's outputs on the device; a
sample that step k ends (a stop token) has a wasted row in step k+1, whose result is dropped. A sample's
last token by ``max_tokens`` is known ahead, so it gets no such row. A step of several programs (deterministic
mode, more sequences than ``deterministic_rows``) fetches its own tokens before the next step is scheduled, and
so does a step with a row that draws under a grammar (its next mask, computed on the host, needs the token:
`halyard.serve.grammar`).
Feeding a token from the device or from the host gives its row the same bits: it is an index, the programs
compute the same (`EngineStats.steps_pipelined` counts the pipelined steps). A program's dispatch and the
folding in of what it drew are `halyard.serve.step_programs`'.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Hashable
from collections.abc import Sequence as Seq
from typing import Any

import jax
import numpy as np

from halyard.models import CausalLM
from halyard.serve.adapters import adapter_count
from halyard.serve.batching import program_groups
from halyard.serve.config import EngineConfig
from halyard.serve.detokenizer import Detokenizer
from halyard.serve.int8_weights import quantized
from halyard.serve.outputs import RequestOutput, Update, run_to_end
from halyard.serve.pages import PageAllocator
from halyard.serve.params import ParameterError, SamplingParams
from halyard.serve.program_store import ProgramStore
from halyard.serve.requests import RequestState, check_prompt, eos_ids_of, new_request_id
from halyard.serve.runner import ModelRunner, fetched
from halyard.serve.scheduler import Chunk, Scheduler, SequenceState
from halyard.serve.speculation import proposer_for, speculated
from halyard.serve.stats import EngineStats
from halyard.serve.step_programs import PLACEHOLDER as PLACEHOLDER
from halyard.serve.step_programs import Dispatched, absorb_program, dispatch
from halyard.serve.text import Decode
from halyard.serve.warmup import warm_up
from halyard.shard import Layout
from halyard.shard.compilation_cache import use_compilation_cache


class Engine:
    """The inference engine; see the module docstring.

    Args:
        model: any `CausalLM` (a family's `Decoder`), on ``mesh`` when given.
        config: sizes and policies (`EngineConfig`).
        decode: the tokenizer's decode (token ids -> text, special tokens left out); needed for text and
            stop strings, None for tokens only.
        eos_token_ids: ids that end a sample (unless ``ignore_eos``); default the model config's.
        mesh, layout: run sharded (tensor parallel over ``tensor``; both or neither).
        draft: the draft model of ``config.speculative == "draft"`` (the same vocabulary).

    Raises:
        ValueError: the config does not fit the model (context longer than its positions, a pool smaller
            than one sequence).
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        *,
        decode: Decode | None = None,
        eos_token_ids: Seq[int] | None = None,
        mesh: jax.sharding.Mesh | None = None,
        layout: Layout | None = None,
        draft: CausalLM | None = None,
    ):
        config = EngineConfig() if config is None else config
        self.config = config
        if adapter_count(model) and config.quantization != "none":
            raise ValueError(
                f"quantization={config.quantization!r} with LoRA adapters: int8 projections drop them; "
                "serve adapters with quantization none"
            )
        if adapter_count(model) and config.speculative != "none":
            raise ValueError(
                f"speculative={config.speculative!r} with LoRA adapters: not supported together yet; "
                "serve adapters without speculation"
            )
        model = quantized(model, config.quantization)
        self.max_context = config.context_for(model)
        self.vocab_size = model.unembedding.axis_size("vocab")
        self.decode = decode
        self._detokenizer = None if decode is None else Detokenizer(decode)
        eos = eos_ids_of(model.model_config) if eos_token_ids is None else eos_token_ids
        self.eos_token_ids = tuple(int(t) for t in eos)
        self.pages = PageAllocator(config.num_pages, config.page_size)
        use_compilation_cache(config.compilation_cache)  # before the runner compiles anything
        max_seqs, max_tokens = config.step_budget()
        self.runner = ModelRunner(
            model,
            num_pages=config.num_pages,
            page_size=config.page_size,
            max_seq_pages=self.pages.pages_for(self.max_context),
            max_tokens=max_tokens,
            max_seqs=max_seqs,
            min_tokens=config.min_rows,
            token_buckets=config.token_buckets,
            invariant=config.deterministic,
            # the XLA kernel of fixed groups and page-by-page folds: the TPU's Pallas kernels choose their
            # blocks by the program's shape, and a decode program runs another kernel than a mixed one
            kernel="blocked" if config.deterministic else "auto",
            mesh=mesh,
            layout=layout,
            program_store=ProgramStore.in_cache(config.compilation_cache),
        )
        self.scheduler = Scheduler(
            self.pages,
            max_running=config.max_running,
            chunk_size=config.chunk_size,
            max_prefill_rows=config.max_prefill_rows,
            recompute_by_decoding=config.deterministic,
            waits_for=lambda sequence: self._requests[sequence.group].waits(sequence),
            step_room=self._step_room,
        )
        self.proposer = proposer_for(config, draft, self.vocab_size)
        self._requests: dict[Any, RequestState] = {}
        self._pending: list[Update] = []
        self._in_flight: Dispatched | None = None  # a pipelined step's program, its results not yet fetched
        self._arrivals = itertools.count()
        self._seeds = np.random.default_rng(config.seed)
        self.stats = EngineStats(pages_total=config.num_pages)
        if config.warmup:
            warm_up(self.runner, logprob_variants=config.warmup_logprobs, threads=config.compile_threads)
            self.stats.compile_seconds = self.runner.compile_seconds
            self.stats.programs_compiled = self.runner.programs_compiled
            self.stats.programs_loaded = self.runner.programs_loaded
            self.stats.programs_traced = self.runner.programs_traced

    # -- requests ------------------------------------------------------------------------------------
    def add_request(
        self,
        prompt: Seq[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        caller: Hashable = None,
    ) -> str:
        """Queue a request; it joins the running batch at a coming step.

        Args:
            prompt: its token ids (at least one).
            params: its sampling settings.
            request_id: a unique id (default: a new one).
            caller: whom admission shares rows fairly between: the requests of one caller (an HTTP request
                of several prompts) count as one (default: this request alone).

        Returns:
            The request id.

        Raises:
            ParameterError: an empty prompt, a token outside the vocabulary, a prompt plus ``max_tokens``
                longer than the context, ``n`` above ``config.max_n`` or samples that need more pages
                together than the pool has, stop strings without a tokenizer, a duplicate id.
        """
        prompt = [int(t) for t in prompt]
        check_prompt(prompt, params, vocab_size=self.vocab_size, max_context=self.max_context)
        if params.adapter > self.runner.adapters:
            raise ParameterError(
                "adapter",
                f"adapter: {params.adapter} is not one of this engine's {self.runner.adapters} adapters",
            )
        self._check_samples_fit(len(prompt), params)
        if params.stop and self.decode is None:
            raise ParameterError("stop", "stop: stop strings need the engine to have a tokenizer")
        request_id = new_request_id() if request_id is None else request_id
        if request_id in self._requests:
            raise ParameterError("request_id", f"request_id: {request_id!r} is already running")
        if params.seed is None:
            params = dataclasses.replace(params, seed=int(self._seeds.integers(0, 2**63 - 1)))
        first = next(self._arrivals)
        for _ in range(params.n - 1):
            next(self._arrivals)
        request = RequestState(request_id, prompt, params, first, self.eos_token_ids, caller=caller)
        self._requests[request_id] = request
        if self._detokenizer is not None:
            self._detokenizer.add(request_id, params.n, params.stop)
        for sample in request.samples:
            self.scheduler.add(sample.sequence)
        self.stats.requests_added += 1
        return request_id

    def _check_samples_fit(self, prompt_length: int, params: SamplingParams) -> None:
        """Raises `ParameterError` (``n``) for more samples than ``config.max_n``, or for samples that
        could never run at once: their pages (the prompt's full pages shared once) exceed the pool."""
        limit = self.config.max_n
        if params.n > limit:
            raise ParameterError(
                "n", f"n: {params.n} samples exceed this server's limit of {limit}; ask for at most {limit}"
            )
        needed = self.pages_needed(prompt_length, params)
        if needed > self.config.num_pages:
            raise ParameterError(
                "n",
                f"n: {params.n} samples of up to {prompt_length + params.max_tokens} tokens need {needed} KV pages "
                f"at once, the pool has {self.config.num_pages}; lower n or max_tokens",
            )

    def pages_needed(self, prompt_length: int, params: SamplingParams) -> int:
        """The pages all ``params.n`` samples of a prompt of ``prompt_length`` tokens hold when they have
        generated ``max_tokens`` each (the prompt's full pages, from the prefix cache, counted once)."""
        per_sample = self.pages.pages_for(prompt_length + params.max_tokens)
        shared = (prompt_length - 1) // self.config.page_size if self.config.prefix_cache else 0
        return shared + params.n * (per_sample - shared)

    def cancel(self, request_id: str) -> None:
        """End a request now (its samples finish with ``abort``) and free its pages; unknown or already
        finished ids are ignored."""
        request = self._requests.get(request_id)
        if request is None:
            return
        request.abort()
        for sample in request.samples:
            self.scheduler.remove(sample.sequence)
        self._pending += request.take_updates()
        del self._requests[request_id]
        self.stats.requests_cancelled += 1

    def stop_sample(self, request_id: str, index: int, stop_string: str) -> None:
        """End sample ``index`` of a request at ``stop_string`` (found by the `Detokenizer` that follows
        this engine's updates) and free its pages; its ending comes with the next step's updates. An
        unknown request or an already finished sample is ignored."""
        request = self._requests.get(request_id)
        if request is None or not request.stop(index, stop_string):
            return
        self.scheduler.remove(request.samples[index].sequence)
        self._pending += request.take_updates()
        if request.finished:
            del self._requests[request_id]
            self.stats.requests_finished += 1

    def hand_off_text(self) -> Decode | None:
        """From now on `step` returns updates without text and leaves stop strings to the caller, who runs
        a `Detokenizer` over them with the decode returned (None: the engine has no tokenizer) and calls
        `stop_sample` for each stop string it finds (the server does this beside its event loop, so the
        engine's thread only steps). Call it before the first request."""
        if self._requests:
            raise RuntimeError(
                "hand_off_text before the first request: running requests' text is the engine's"
            )
        self._detokenizer = None
        return self.decode

    def update_weights(self, model: CausalLM) -> None:
        """Generate with ``model``'s weights from the next step on (a training step's new weights, handed
        over in memory): same structure and shapes, placed as the current ones, so nothing compiles again.
        Cached prefixes are forgotten (their keys and values came from the old weights).

        With ``quantization="int8"`` the new weights are quantized as the first were.

        Raises:
            ValueError: ``model``'s pytree structure or shapes differ from the current model's.
            RuntimeError: requests are running (their keys and values would mix two models).
        """
        model = quantized(model, self.config.quantization)
        current: Any = jax.tree.structure(self.runner.model)
        shapes = [getattr(leaf, "shape", None) for leaf in jax.tree.leaves(self.runner.model)]
        if (
            jax.tree.structure(model) != current
            or [getattr(x, "shape", None) for x in jax.tree.leaves(model)] != shapes
        ):
            raise ValueError("update_weights takes weights of the current model's structure and shapes")
        if self.scheduler.running:
            raise RuntimeError("update_weights while requests are running: finish or cancel them first")
        self.runner.model = model
        self.pages.clear_cache()

    def knows(self, request_id: str) -> bool:
        """Whether ``request_id`` is unfinished here."""
        return request_id in self._requests

    @property
    def has_work(self) -> bool:
        """Whether any request is unfinished (or an update is still to be handed out)."""
        return bool(self._requests) or bool(self._pending) or self._in_flight is not None

    # -- steps ---------------------------------------------------------------------------------------
    def step(self) -> list[Update]:
        """Run one step; returns what it added to each request (and updates of cancellations)."""
        updates = self._step()
        if self._detokenizer is None:
            return updates
        shown, stops = self._detokenizer.process(updates)
        for stop in stops:
            self.stop_sample(*stop)
        return shown

    def _step(self) -> list[Update]:
        """Schedule and dispatch a step, then fold in the results of the step before it (the device runs this
        step meanwhile: the decoding rows' new tokens go from the one program to the next on the device), and
        of this one unless it is pipelined (one program)."""
        started = time.perf_counter()
        updates, self._pending = self._pending, []
        plan = self.scheduler.schedule()
        if self.proposer is not None:
            decode = speculated(
                plan.decode, self._requests.__getitem__, self.proposer,
                tokens=self.config.speculative_tokens, pages=self.pages,
            )  # fmt: skip
            plan = dataclasses.replace(plan, decode=decode)
        self.stats.preemptions += len(plan.preempted)
        if plan.empty and self.scheduler.waiting and not self.scheduler.running and not plan.preempted:
            raise RuntimeError("the engine cannot admit the request at the head of the queue (too few pages)")
        previous = self._in_flight
        max_seqs, max_tokens = self.config.step_budget()
        groups = program_groups(plan.decode + plan.prefill, max_seqs, max_tokens)
        # several programs: each would feed from several before it; a grammar's row: its next mask needs the
        # token this step draws (steps with a constrained row run unpipelined; see the module docstring);
        # speculation: the next step's proposals need this step's tokens
        pipelined = (
            len(groups) == 1
            and self.proposer is None
            and not any(self._constrained(group) for group in groups)
        )
        dispatched = [self._dispatch(group, previous, pipelined) for group in groups]
        self._in_flight = dispatched.pop() if pipelined else None
        self.stats.steps_pipelined += pipelined
        if previous is not None:
            dispatched.insert(0, previous)  # its tokens come before this step's
        touched: dict[Any, RequestState] = {}
        for program in dispatched:  # every program runs before the first result is awaited
            absorbed = absorb_program(
                program, fetched(program[2]), self._requests,
                pages=self.pages, scheduler=self.scheduler, stats=self.stats, prefix_cache=self.config.prefix_cache,
            )  # fmt: skip
            touched.update((request.request_id, request) for request in absorbed)
        for request in touched.values():
            updates += request.take_updates()
            if request.finished:
                self._requests.pop(request.request_id, None)
                self.stats.requests_finished += 1
        self.stats.record_step(
            seconds=time.perf_counter() - started,
            waiting=len(self.scheduler.waiting),
            running=len(self.scheduler.running),
            pages_in_use=self.pages.in_use,
            compile_seconds=self.runner.compile_seconds,
            programs_compiled=self.runner.programs_compiled,
            programs_loaded=self.runner.programs_loaded,
            programs_traced=self.runner.programs_traced,
        )
        return updates

    def _step_room(self, sequences: int, tokens: int) -> int:
        """The tokens one more chunk may add to a step of ``sequences`` chunks and ``tokens`` tokens without a
        larger program: the padding of the program it runs in (`ModelRunner.bucket`; 0 when a program holds no
        more sequences)."""
        max_seqs, _ = self.config.step_budget()
        if sequences >= max_seqs:
            return 0
        return self.runner.bucket(tokens) - tokens

    def _constrained(self, chunks: list[Chunk]) -> bool:
        """Whether a chunk draws under a grammar."""
        return any(c.samples and self._requests[c.sequence.group].params.grammar is not None for c in chunks)

    def _dispatch(self, chunks: list[Chunk], previous: Dispatched | None, pipelined: bool) -> Dispatched:
        """Start the program of ``chunks`` (`dispatch`): they take the tokens ``previous`` drew; ``pipelined``:
        its own tokens are fetched at the next step."""
        requests = [self._requests[chunk.sequence.group] for chunk in chunks]
        return dispatch(
            chunks, requests, previous, pipelined=pipelined,
            runner=self.runner, pages=self.pages, stats=self.stats, prefix_cache=self.config.prefix_cache,
            speculative_tokens=self.config.speculative_tokens,
        )  # fmt: skip

    # -- conveniences --------------------------------------------------------------------------------
    def generate(
        self, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams]
    ) -> list[RequestOutput]:
        """Run ``prompts`` to the end (together with whatever else is queued) and return their outputs.

        Args:
            prompts: token id lists.
            params: one setting for all, or one per prompt.
        """
        return run_to_end(self, prompts, params)

    def sequences(self) -> list[SequenceState]:
        """Every unfinished sequence (waiting or running)."""
        return [sample.sequence for request in self._requests.values() for sample in request.samples]
