"""`SamplingParams`: how one request is continued (the per-request knobs of OpenAI's completions API)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from halyard.serve.grammar import Grammar

MAX_TOP_LOGPROBS = 20
"""The most alternatives a request may ask for per token (OpenAI's limit)."""

MAX_LOGIT_BIAS = 300
"""The most tokens one request may bias (``logit_bias``; each row of a step program holds this many)."""


class ParameterError(ValueError):
    """A request parameter is out of range; ``parameter`` names it (the server answers 400 with it)."""

    def __init__(self, parameter: str, message: str):
        super().__init__(message)
        self.parameter = parameter


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings.

    Attributes:
        max_tokens: the most tokens to generate per sample; the sample ends with ``finish_reason``
            ``length`` when it reaches them.
        temperature: softmax temperature; ``0`` is greedy (argmax).
        top_k: keep only the ``top_k`` most likely tokens; ``0`` keeps all.
        top_p: keep the most likely tokens whose probability reaches ``top_p`` (after ``top_k``).
        min_p: drop tokens whose probability is below ``min_p`` times the most likely one's (after
            ``top_p``); ``0`` keeps all. The order of the filters is transformers' (temperature, top-k,
            top-p, min-p).
        seed: the random seed of this request: the same seed gives the same samples whatever else the
            engine runs; None draws one.
        n: samples per prompt (they share the prompt's pages).
        stop: strings that end a sample when generated (left out of the returned text).
        stop_token_ids: token ids that end a sample (kept in the tokens, left out of the text).
        ignore_eos: keep going past the model's end-of-sequence ids.
        logprobs: return the log-probability of each generated token.
        top_logprobs: also return this many most likely alternatives per token (at most 20).
        prompt_logprobs: return the log-probability of every prompt token after the first (``echo``);
            such a request never reads the prefix cache.
        logit_bias: ``(token id, bias)`` pairs added to those tokens' logits before the filters and the
            draw (OpenAI's ``logit_bias``, bias in [-100, 100]; the reported ``logprob`` stays the model's).
        grammar: the grammar every sample's tokens follow (`halyard.serve.grammar.Grammars` compiles it):
            each step masks the tokens it does not allow next; a sample ends (``stop``) when the grammar is
            complete. None: unconstrained.
        adapter: the LoRA adapter the request runs with: its index among the engine's model's adapters
            (`halyard.serve.adapters`; 1 the first), 0 the base model.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: Grammar | None = None
    adapter: int = 0

    def __post_init__(self) -> None:
        def check(ok: bool, parameter: str, message: str) -> None:
            if not ok:
                raise ParameterError(parameter, f"{parameter}: {message}")

        check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "must be at least 1")
        check(
            math.isfinite(self.temperature) and self.temperature >= 0,
            "temperature",
            f"must be a number >= 0 (0 = greedy), got {self.temperature}",
        )
        check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", f"must be >= 0, got {self.top_k}")
        check(0.0 < self.top_p <= 1.0, "top_p", f"must lie in (0, 1], got {self.top_p}")
        check(0.0 <= self.min_p <= 1.0, "min_p", f"must lie in [0, 1], got {self.min_p}")
        check(
            isinstance(self.adapter, int) and self.adapter >= 0,
            "adapter",
            f"must be >= 0, got {self.adapter}",
        )
        check(isinstance(self.n, int) and self.n >= 1, "n", f"must be at least 1, got {self.n}")
        check(
            self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
            "seed",
            f"must be an integer in [0, 2**63), got {self.seed}",
        )
        check(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty")
        check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be token ids (integers >= 0)",
        )
        check(
            0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
            "top_logprobs",
            f"must lie in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}",
        )

        check(
            len(self.logit_bias) <= MAX_LOGIT_BIAS,
            "logit_bias",
            f"biases {len(self.logit_bias)} tokens, more than {MAX_LOGIT_BIAS}",
        )
        check(
            all(
                isinstance(t, int) and t >= 0 and math.isfinite(b) and -100 <= b <= 100
                for t, b in self.logit_bias
            ),
            "logit_bias",
            "must map token ids (integers >= 0) to biases in [-100, 100]",
        )

    @property
    def constrained(self) -> bool:
        """Whether a step's row of this request needs a mask or a bias (`halyard.serve.grammar`)."""
        return self.grammar is not None or bool(self.logit_bias)

    @property
    def greedy(self) -> bool:
        """Whether each token is the argmax (temperature 0)."""
        return self.temperature == 0.0
