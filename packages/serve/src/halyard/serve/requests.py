"""`RequestState`: one request inside the engine: its samples' sequences, log-probs and endings (the text is
the `halyard.serve.detokenizer.Detokenizer`'s)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Hashable
from typing import Any

from halyard.serve.grammar import Constraint
from halyard.serve.outputs import TopLogprobs, Update
from halyard.serve.params import ParameterError, SamplingParams
from halyard.serve.scheduler import SequenceState

_request_numbers = itertools.count()


def new_request_id() -> str:
    """A request id unique in this process, ``req-N`` (the engine's, the replicas' and the server's)."""
    return f"req-{next(_request_numbers)}"


def eos_ids_of(model_config: Any, *tokenizer_eos: int | None) -> tuple[int, ...]:
    """The ids that end a sample: ``model_config.eos_token_ids`` (a checkpoint's, all of them), then the
    tokenizer's EOS ids ``tokenizer_eos`` (None: the tokenizer has none), each once, in that order."""
    ids = [int(t) for t in getattr(model_config, "eos_token_ids", ()) or ()]
    ids += [int(t) for t in tokenizer_eos if t is not None]
    return tuple(dict.fromkeys(ids))


def check_prompt(prompt: list[int], params: SamplingParams, *, vocab_size: int, max_context: int) -> None:
    """Raises `ParameterError` for an empty prompt, a token outside ``vocab_size``, or a prompt that leaves
    no room (or not ``params.max_tokens``) in a context of ``max_context`` tokens."""
    if not prompt:
        raise ParameterError("prompt", "prompt: is empty; give at least one token")
    outside = [t for t in prompt if not 0 <= t < vocab_size]
    if outside:
        raise ParameterError(
            "prompt", f"prompt: token id {outside[0]} is outside the vocabulary of {vocab_size}"
        )
    if len(prompt) >= max_context:
        raise ParameterError(
            "prompt",
            f"prompt: {len(prompt)} tokens leave no room in the context of {max_context} tokens; shorten it",
        )
    if len(prompt) + params.max_tokens > max_context:
        raise ParameterError(
            "max_tokens",
            f"max_tokens: the prompt's {len(prompt)} tokens plus max_tokens={params.max_tokens} exceed the "
            f"context of {max_context} tokens; ask for at most {max_context - len(prompt)}",
        )
    biased = [t for t, _ in params.logit_bias if t >= vocab_size]
    if biased:
        raise ParameterError(
            "logit_bias", f"logit_bias: token id {biased[0]} is outside the vocabulary of {vocab_size}"
        )
    if params.grammar is not None and params.grammar.vocab_size != vocab_size:
        raise ParameterError(
            "response_format",
            f"response_format: the grammar was compiled for a vocabulary of {params.grammar.vocab_size} tokens, "
            f"the model has {vocab_size}",
        )


@dataclasses.dataclass
class SampleState:
    """One sample: its sequence and what it has not reported yet."""

    index: int
    sequence: SequenceState
    constraint: Constraint | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    pending: Update | None = None


class RequestState:
    """A request's samples and how each ends.

    Args:
        request_id: the request's id.
        prompt: its token ids.
        params: its sampling settings (``seed`` already drawn).
        first_arrival: the arrival number of its first sample (the others follow it).
        eos_token_ids: the model's end-of-sequence ids (they end a sample unless ``ignore_eos``).
        caller: whom admission shares rows fairly between (`halyard.serve.scheduler`); None: the request.
    """

    def __init__(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        first_arrival: int,
        eos_token_ids: tuple[int, ...],
        caller: Hashable = None,
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.stop_tokens = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.samples = [
            SampleState(
                index,
                SequenceState(
                    key=(request_id, index),
                    group=request_id,
                    tokens=list(prompt),
                    prompt_length=len(prompt),
                    arrival=first_arrival + index,
                    use_prefix_cache=not (params.prompt_logprobs and index == 0),
                    caller=caller,
                    adapter=params.adapter,
                ),
                None if params.grammar is None else params.grammar.constraint(),
            )
            for index in range(params.n)
        ]
        self.prompt_written = False
        self.prompt_logprobs: list[float | None] = [None] if params.prompt_logprobs else []
        self.prompt_top_logprobs: list[TopLogprobs | None] = [None] if params.prompt_logprobs else []

    def waits(self, sequence: SequenceState) -> bool:
        """Whether ``sequence`` must wait for its first sibling to write the prompt's pages."""
        return sequence.key[1] > 0 and not self.prompt_written  # type: ignore[index]

    def sample_of(self, sequence: SequenceState) -> SampleState:
        return self.samples[sequence.key[1]]  # type: ignore[index]

    @property
    def finished(self) -> bool:
        return all(sample.finish_reason is not None for sample in self.samples)

    def add_prompt_logprobs(self, logprobs: list[float], top: list[TopLogprobs]) -> Update | None:
        """Collect prompt log-probs of consecutive positions; an `Update` for sample 0 once complete."""
        self.prompt_logprobs += logprobs
        self.prompt_top_logprobs += top
        if len(self.prompt_logprobs) < len(self.prompt):
            return None
        update = self._update(self.samples[0])
        update.prompt_logprobs = self.prompt_logprobs[: len(self.prompt)]
        update.prompt_top_logprobs = self.prompt_top_logprobs[: len(self.prompt)]
        return update

    def add_token(
        self,
        sequence: SequenceState,
        position: int,
        token: int,
        logprob: float,
        sampled_logprob: float,
        top: TopLogprobs,
    ) -> Update:
        """Put a drawn token at index ``position`` of ``sequence``'s tokens (appended, or over the placeholder
        a pipelined engine put there when it dispatched the step) and decide whether its sample ends (at a
        stop token or ``max_tokens``; stop strings are the `Detokenizer`'s)."""
        sample = self.sample_of(sequence)
        if position == len(sequence.tokens):
            sequence.tokens.append(token)
        else:
            sequence.tokens[position] = token
        if sample.index == 0:
            self.prompt_written = True
        update = self._update(sample)
        update.token_ids.append(token)
        update.logprobs.append(logprob)
        update.sampled_logprobs.append(sampled_logprob)
        update.top_logprobs.append(top[: self.params.top_logprobs])
        complete = sample.constraint is not None and sample.constraint.consume(token)
        if token in self.stop_tokens or complete:
            self._finish(sample, "stop", token if token in self.stop_tokens else None)
        elif position + 1 - sequence.prompt_length >= self.params.max_tokens:
            self._finish(sample, "length", None)
        return update

    def stop(self, index: int, stop_string: str) -> bool:
        """End sample ``index`` at a stop string the `Detokenizer` found; False when it had already ended."""
        sample = self.samples[index]
        if sample.finish_reason is not None:
            return False
        self._finish(sample, "stop", stop_string)
        return True

    def abort(self) -> None:
        """End every unfinished sample with ``abort`` (collect the updates with `take_updates`)."""
        for sample in self.samples:
            if sample.finish_reason is None:
                self._finish(sample, "abort", None)

    def _finish(self, sample: SampleState, reason: str, stop_reason: str | int | None) -> None:
        sample.finish_reason, sample.stop_reason = reason, stop_reason
        update = self._update(sample)
        update.finish_reason, update.stop_reason = reason, stop_reason

    def _update(self, sample: SampleState) -> Update:
        if sample.pending is None:
            sample.pending = Update(self.request_id, sample.index, [], "", [], [], [])
        return sample.pending

    def take_updates(self) -> list[Update]:
        """The updates gathered since the last call, one per sample that changed."""
        updates = []
        for sample in self.samples:
            if sample.pending is not None:
                updates.append(sample.pending)
                sample.pending = None
        return updates
