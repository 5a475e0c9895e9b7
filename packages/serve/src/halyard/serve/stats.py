"""`EngineStats`: counters and gauges of an engine (the server's metrics endpoint reads them)."""

from __future__ import annotations

import collections
import dataclasses
import time


@dataclasses.dataclass
class EngineStats:
    """What the engine did so far and what it holds now.

    Attributes:
        pages_total: pages in the pool.
        waiting, running: sequences queued and sequences holding pages, after the last step.
        pages_in_use: pages owned by running sequences after the last step.
        requests_added, requests_finished, requests_cancelled: request counts.
        tokens_generated: tokens drawn.
        tokens_computed: tokens fed through the model (prompt, recomputation and decoding).
        preemptions: sequences preempted for lack of pages (recomputed later).
        tokens_proposed, tokens_accepted: speculative tokens fed to be verified, and those kept
            (`halyard.serve.speculation`).
        steps: engine steps run.
        steps_pipelined: steps of one program, dispatched before the step before them was fetched (a step
            of several programs, in deterministic mode, fetches its own tokens).
        compile_seconds: time spent compiling programs.
        programs_compiled: programs compiled so far (each step shape's program and the program that stores
            its keys and values; after a warm-up, `EngineConfig.warmup`, it stays unless a request asks for
            prompt log-probs).
        programs_loaded: step programs read from the persistent compilation cache
            (`EngineConfig.compilation_cache`) instead of compiled.
        programs_traced: step programs traced from the model (with `EngineConfig.compilation_cache`, the
            others were lowered from the programs a start before stored: `halyard.serve.program_store`).
    """

    pages_total: int
    waiting: int = 0
    running: int = 0
    pages_in_use: int = 0
    requests_added: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    tokens_generated: int = 0
    tokens_computed: int = 0
    preemptions: int = 0
    tokens_proposed: int = 0
    tokens_accepted: int = 0
    steps: int = 0
    steps_pipelined: int = 0
    compile_seconds: float = 0.0
    programs_compiled: int = 0
    programs_loaded: int = 0
    programs_traced: int = 0
    _recent: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=256))
    _rate: float | None = None

    @classmethod
    def combined(cls, parts: list[EngineStats]) -> EngineStats:
        """The stats of several engines added up (compile time: the longest; tokens/s: the sum)."""
        total = cls(pages_total=sum(part.pages_total for part in parts))
        for field in dataclasses.fields(cls):
            if not field.name.startswith("_") and field.name != "pages_total":
                setattr(total, field.name, sum(getattr(part, field.name) for part in parts))
        total.compile_seconds = max((part.compile_seconds for part in parts), default=0.0)
        total._rate = sum(part.tokens_per_second() for part in parts)
        return total

    def record_step(
        self,
        *,
        seconds: float,
        waiting: int,
        running: int,
        pages_in_use: int,
        compile_seconds: float,
        programs_compiled: int,
        programs_loaded: int,
        programs_traced: int,
    ) -> None:
        """Note one step's duration and the gauges after it (the compile figures are the runner's totals)."""
        self.steps += 1
        self.waiting, self.running, self.pages_in_use = waiting, running, pages_in_use
        self.compile_seconds, self.programs_compiled = compile_seconds, programs_compiled
        self.programs_loaded, self.programs_traced = programs_loaded, programs_traced
        self._recent.append((time.monotonic(), self.tokens_generated))

    def tokens_per_second(self) -> float:
        """Generated tokens per second over the recent steps (0 before two steps)."""
        if self._rate is not None:
            return self._rate
        if len(self._recent) < 2:
            return 0.0
        (start, first), (end, last) = self._recent[0], self._recent[-1]
        return (last - first) / (end - start) if end > start else 0.0

    def as_dict(self) -> dict[str, float]:
        """Every counter and gauge, plus ``tokens_per_second``."""
        values = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")
        }
        values["tokens_per_second"] = self.tokens_per_second()
        return values
