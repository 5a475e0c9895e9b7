"""Structured outputs: the grammar a request's tokens must follow, and each sample's place in it.

The grammars are llguidance's (a Rust library with Python wheels and no dependencies: JSON schemas, Lark
grammars and regular expressions, compiled against the served tokenizer; the server uses JSON schemas). `Grammars` compiles a request's
grammar once, refusing one the library cannot compile with the library's reason; each sample of a
constrained request follows it with a `Constraint` (an ``LLMatcher``), which gives the mask of the tokens
allowed next (a packed bitmask, one bit per vocabulary entry, computed on the host) and consumes the token
drawn. The masks are applied inside the step program (`halyard.serve.sampler.adjusted_logits`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np


class GrammarError(ValueError):
    """A grammar the library cannot compile; ``parameter`` names the request field it came from, and the
    message starts with it (a server answers 400 with both)."""

    def __init__(self, parameter: str, message: str):
        super().__init__(message)
        self.parameter = parameter


COMPACT_JSON = {"whitespace_flexible": False}
"""JSON without whitespace between tokens (``{"a":1}``): a model cannot spend its tokens on blank space."""


@dataclasses.dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar (`Grammars.compile`), shared by every sample of the requests that use it.

    Attributes:
        source: llguidance's grammar (a JSON string).
        tokenizer: the ``LLTokenizer`` it was compiled for.
        vocab_size: the model's vocabulary (the width of the masks).
    """

    source: str
    tokenizer: Any
    vocab_size: int

    def constraint(self) -> Constraint:
        """A new sample's place in the grammar: at its start."""
        return Constraint(llguidance.LLMatcher(self.tokenizer, self.source, log_level=0))


class Constraint:
    """One sample's place in its grammar: the tokens it may draw next, and the tokens it drew."""

    def __init__(self, matcher: Any):
        self._matcher = matcher

    def fill_mask(self, mask: np.ndarray, row: int) -> None:
        """Write the bitmask of the tokens allowed next into row ``row`` of ``mask`` (int32 ``[rows, words]``;
        bit ``t % 32`` of word ``t // 32`` set: token ``t`` allowed)."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, mask, row)

    def consume(self, token: int) -> bool:
        """Advance past a drawn ``token``; returns whether the grammar is complete (nothing more may follow).

        Raises:
            RuntimeError: ``token`` was not allowed (the mask was not applied).
        """
        if not self._matcher.consume_token(token):
            raise RuntimeError(
                f"a constrained sample drew token {token}, which its grammar does not allow: "
                f"{self._matcher.get_error()}"
            )
        return bool(self._matcher.is_stopped())


class Grammars:
    """Compiles grammars against one tokenizer and vocabulary (the server's, so that a mask's bits are the
    model's token ids). Reading the tokenizer takes llguidance seconds for a vocabulary of 150k tokens, so it
    is read on a thread of its own from the start; the first grammar waits for it.

    Args:
        tokenizer_json: the Hugging Face ``tokenizers`` tokenizer, serialised (``Tokenizer.to_str()``).
        vocab_size: the model's vocabulary (at least the tokenizer's; ids past the tokenizer's are never
            allowed).
        eos_token_ids: the ids that end a sample; a grammar allows them where it may end.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]):
        self.vocab_size = vocab_size
        reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar-tokenizer")
        self._reading = reader.submit(
            llguidance.LLTokenizer, tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None
        )
        reader.shutdown(wait=False)  # its thread ends with the reading

    @property
    def tokenizer(self) -> Any:
        """llguidance's ``LLTokenizer`` (waits until it is read).

        Raises:
            ValueError: llguidance cannot read the tokenizer (one without a byte-level or byte-fallback
                decoder, e.g. a word-level one).
        """
        return self._reading.result()

    def json_schema(self, schema: dict[str, Any] | None, parameter: str) -> Grammar:
        """The grammar of compact JSON that validates against ``schema`` (None: any JSON object).

        Raises:
            GrammarError: (``parameter``) a schema the library cannot compile, with its reason.
        """
        try:
            source = llguidance.LLMatcher.grammar_from_json_schema(
                {"type": "object"} if schema is None else schema,
                overrides=COMPACT_JSON,  # type: ignore[arg-type]
            )
        except (ValueError, TypeError) as error:
            raise GrammarError(parameter, f"{parameter}: not a JSON schema ({error})") from None
        return self.compile(source, parameter)

    def compile(self, source: str, parameter: str) -> Grammar:
        """llguidance's grammar ``source`` checked against this tokenizer.

        Raises:
            GrammarError: (``parameter``) the library cannot compile it; the message is its reason.
        """
        error = llguidance.LLMatcher.validate_grammar(source, self.tokenizer)
        if error and not error.startswith("WARNING"):
            reason = " ".join(error.split())
            raise GrammarError(parameter, f"{parameter}: the grammar library cannot compile it: {reason}")
        return Grammar(source, self.tokenizer, self.vocab_size)
