"""`EngineConfig`: the engine's sizes and policies."""

from __future__ import annotations

import dataclasses

from halyard.models import CausalLM
from halyard.serve.int8_weights import check_quantization

SPECULATIVE_METHODS = ("none", "ngram", "draft")
"""`EngineConfig.speculative`'s values (`halyard.serve.speculation`)."""

DEFAULT_CONTEXT = 4096
"""The context of a model without a position limit when ``max_context`` is not set."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Sizes and policies of an `halyard.serve.Engine`.

    Attributes:
        page_size: tokens per KV page. The default equals the CPU attention kernel's block (64), so a
            page is one key block of the training kernel.
        num_pages: pages in the pool; KV memory is ``num_pages * page_size`` tokens of every layer's keys
            and values.
        max_context: the longest sequence (prompt plus generated tokens); None: the positions the model
            was configured for (``max_position``, a checkpoint's ``max_position_embeddings``), else
            `DEFAULT_CONTEXT`.
        max_running: the most sequences that run at once (the decoding program's rows).
        chunk_size: the most prompt tokens one sequence is fed per step (chunked prefill).
        max_prefill_rows: the most sequences prefilled in one step, beyond those whose chunks fill the
            padding of its program (`halyard.serve.scheduler`).
        min_rows: programs are compiled for token counts from this one up to the most one step holds
            (`step_budget`): this one times powers of two, and from 48 up also 1.5 times each (48, 96,
            192, ...; `halyard.serve.program.token_ladder`), so a step is at most a third padding.
        token_buckets: the token counts of the step programs below the most one step holds
            (`step_budget`), ascending, instead of ``min_rows``' ladder: a step runs in the smallest
            that holds its tokens, else in a program of the most. Empty: ``min_rows``' ladder. An RL engine
            sets its decoding rows' buckets alone, so steps with prefill chunks run at the most and it
            compiles fewer programs.
        deterministic: a request's tokens and log-probs are bitwise the same whatever else runs beside
            it, in whatever order requests arrive, wherever its prefill chunks fall, whether its prefix
            comes from the cache and whether it was preempted. Every step program computes a token with
            arithmetic whose order does not depend on the batch (`halyard.named.nn.batch_invariant`: products
            in fixed blocks of rows, row sums in a fixed order; `halyard.serve.runner`), so it runs the
            programs of the fast mode's sizes and probes nothing when it starts (docs: serving,
            deterministic mode).
        deterministic_rows: the most sequences of one step program in deterministic mode; None:
            ``max_running`` (a step is one program, pipelined as in the fast mode). Fewer split a step of more
            running sequences into several programs, each step then fetched before the next is scheduled.
        training_arithmetic: deterministic mode whose log-probs must equal a GRPO trainer's: the programs
            are deterministic mode's (the training step's batch-invariant arithmetic,
            `halyard.named.nn.batch_invariant`, as ``trainer.objective: grpo`` computes), and in a process
            where XLA fuses no multiply-adds (`halyard.named.nn.unfuse_multiply_add`, which ``--training-
            arithmetic`` calls) a token's log-probs equal those of a training forward pass traced inside
            ``batch_invariant`` bit for bit. Refuses int8 weights (the trainer's are not).
        prefix_cache: share the pages of common prompt prefixes between requests.
        max_n: the most samples one request may ask for (OpenAI's limit of ``n``, 128). A request's samples
            must also fit the pool together (`halyard.serve.Engine.add_request` refuses one that could
            never run at once).
        seed: draws the seeds of requests that give none.
        warmup: compile every step program the engine can ask for when it starts, logging a progress line
            per shape (`halyard.serve.warmup`), so that no step compiles later (``EngineStats.
            programs_compiled`` stays), except those of requests asking for log-prob extras (below);
            otherwise each compiles at its first use.
        warmup_logprobs: with ``warmup``, also compile the program variants of requests that ask for top
            alternatives (``top_logprobs``) or prompt log-probs, four programs per shape instead of one,
            so that no step compiles later whatever a request asks.
        compile_threads: how many step programs warm-up compiles at once; None: the machine's cores
            (``os.cpu_count()``).
        compilation_cache: a folder for JAX's persistent compilation cache (`halyard.shard.compilation_cache`,
            the mechanism training's ``trainer.compilation_cache`` uses): a second start loads its programs
            from there, and lowers them from the step programs the first stored in its ``halyard-programs``
            folder instead of tracing the model (`halyard.serve.program_store`). None: no cache, unless this
            process set one already (then no stored programs).
        quantization: ``none``, or ``int8``: the attention and MLP projections' weights and the output head
            held as int8 with a float32 scale per output channel, converted inside each product
            (`halyard.serve.int8_weights`; the embedding lookup reads the model's table). Halves the weight
            bytes decoding reads each step (from bfloat16); not with ``training_arithmetic`` (a trainer's
            log-probs come from the unquantized weights).
        speculative: ``none``; ``ngram`` (prompt lookup: a decoding row proposes the tokens that followed
            the latest earlier occurrence of its last ``speculative_ngram`` tokens, or fewer); or ``draft``
            (a draft model, given to the `halyard.serve.Engine`, proposes them). One step verifies a row's
            proposals and keeps the tokens it would have drawn one at a time (`halyard.serve.speculation`).
        speculative_tokens: the most tokens a row proposes a step.
        speculative_ngram: the longest n-gram prompt lookup matches.
    """

    page_size: int = 64
    num_pages: int = 512
    max_context: int | None = None
    max_running: int = 64
    chunk_size: int = 128
    max_prefill_rows: int = 4
    min_rows: int = 1
    token_buckets: tuple[int, ...] = ()
    deterministic: bool = False
    deterministic_rows: int | None = None
    training_arithmetic: bool = False
    prefix_cache: bool = True
    max_n: int = 128
    seed: int = 0
    warmup: bool = False
    warmup_logprobs: bool = False
    compile_threads: int | None = None
    compilation_cache: str | None = None
    quantization: str = "none"
    speculative: str = "none"
    speculative_tokens: int = 4
    speculative_ngram: int = 3

    def __post_init__(self) -> None:
        for name in (
            "page_size", "num_pages", "max_running", "chunk_size", "max_prefill_rows", "min_rows", "max_n",
            "speculative_tokens", "speculative_ngram",
        ):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {value!r}")
        object.__setattr__(self, "token_buckets", _checked_buckets(self.token_buckets))
        if self.token_buckets and self.min_rows != 1:
            raise ValueError("EngineConfig takes token_buckets or min_rows, not both")
        rows = self.deterministic_rows
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            raise ValueError(f"EngineConfig.deterministic_rows must be a positive int or None, got {rows!r}")
        if self.compile_threads is not None and (
            not isinstance(self.compile_threads, int) or self.compile_threads < 1
        ):
            raise ValueError(
                f"EngineConfig.compile_threads must be a positive int or None, got {self.compile_threads!r}"
            )
        if self.training_arithmetic and not self.deterministic:
            raise ValueError(
                "EngineConfig.training_arithmetic needs deterministic=True (its batch-invariant programs)"
            )
        if self.warmup_logprobs and not self.warmup:
            raise ValueError(
                "EngineConfig.warmup_logprobs needs warmup=True (it widens what warm-up compiles)"
            )
        check_quantization(self.quantization)
        if self.quantization != "none" and self.training_arithmetic:
            raise ValueError(
                f"EngineConfig.quantization={self.quantization!r} does not go with training_arithmetic (the "
                "trainer's log-probs come from the unquantized weights); use quantization='none'"
            )
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(
                f"EngineConfig.speculative must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.speculative!r}"
            )
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"EngineConfig.max_context must be at least 2, got {self.max_context}")

    @classmethod
    def sized_for(
        cls, *, sequences: int, context: int, page_size: int = 64, **changes: object
    ) -> EngineConfig:
        """A config whose pool holds ``sequences`` sequences of ``context`` tokens at once, running them all
        together (``max_running = sequences``), or the ``max_n`` samples of one request when ``changes``
        sets more; ``changes`` set other fields."""
        held = max(sequences, int(changes.get("max_n", 0)))  # type: ignore[call-overload]
        pages = held * -(-context // page_size)
        fields: dict = dict(page_size=page_size, num_pages=pages, max_context=context, max_running=sequences)
        fields.update(changes)
        return cls(**fields)

    def context_for(self, model: CausalLM) -> int:
        """The context the engine gives ``model``'s sequences.

        Raises:
            ValueError: ``max_context`` exceeds the model's positions, or one sequence of the full
                context does not fit the pool.
        """
        limit = model.position_limit
        shape = getattr(model.model_config, "shape", None)
        configured = getattr(shape, "max_position", None)
        context = self.max_context or limit or configured or DEFAULT_CONTEXT
        if limit is not None and context > limit:
            raise ValueError(
                f"EngineConfig.max_context={context} exceeds the {limit} positions the model has; "
                f"set max_context to at most {limit}"
            )
        needed = -(-context // self.page_size)
        if needed > self.num_pages:
            raise ValueError(
                f"EngineConfig.num_pages={self.num_pages} holds {self.num_pages * self.page_size} tokens, less "
                f"than one sequence of max_context={context}; raise num_pages to at least {needed} or lower max_context"
            )
        return context

    def step_budget(self) -> tuple[int, int]:
        """``(sequences, tokens)``: the most of one step program. A step holds every running sequence's
        chunk (decoding tokens and at most ``max_prefill_rows`` prefill chunks); in deterministic mode at
        most ``deterministic_rows`` sequences go into one program (a step runs as many as it needs). With
        ``speculative``, each decoding row can feed ``speculative_tokens`` proposals more."""
        seqs = self.max_running
        if self.deterministic and self.deterministic_rows is not None:
            seqs = min(self.deterministic_rows, self.max_running)
        proposed = seqs * self.speculative_tokens if self.speculative != "none" else 0
        return seqs, seqs + proposed + self.max_prefill_rows * self.chunk_size


def _checked_buckets(buckets: object) -> tuple[int, ...]:
    """``buckets`` as a tuple; raises `ValueError` unless they are ascending positive ints."""
    values = list(buckets) if isinstance(buckets, (tuple, list)) else None
    if values is None or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 1 and (i == 0 or b > values[i - 1])
        for i, b in enumerate(values)
    ):
        raise ValueError(f"EngineConfig.token_buckets must be ascending positive ints, got {buckets!r}")
    return tuple(values)
