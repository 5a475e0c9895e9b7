"""What the engine hands back: per-step `Update` s (for streaming) and whole `RequestOutput` s (`run_to_end`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from halyard.serve.params import SamplingParams

TopLogprobs = list[tuple[int, float]]
"""The most likely alternatives at one position: ``(token id, log-probability)``, most likely first."""

FINISH_REASONS = ("stop", "length", "abort")
"""``stop``: a stop token or string (or EOS); ``length``: ``max_tokens`` reached; ``abort``: cancelled."""


@dataclasses.dataclass
class Update:
    """What one engine step added to one sample of a request.

    Attributes:
        request_id: the request.
        index: the sample's index (0 .. n - 1).
        token_ids: the tokens generated this step (one, or none when only text or the finish changed).
        text: the new text that is safe to show (see `halyard.serve.text.SampleText.stream`).
        logprobs: the model's log-probability of each new token.
        sampled_logprobs: each new token's log-probability under the distribution it was drawn from.
        top_logprobs: the requested number of alternatives for each new token (empty lists if none).
        finish_reason: None while the sample goes on, else one of `FINISH_REASONS`.
        stop_reason: the stop string or token id that ended the sample, if one did.
        prompt_logprobs: for ``index == 0``, once, when the prompt has been read and prompt log-probs were
            asked for: one entry per prompt token, None for the first.
        prompt_top_logprobs: the alternatives at each prompt position (None for the first), likewise.
    """

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]
    sampled_logprobs: list[float]
    top_logprobs: list[TopLogprobs]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[TopLogprobs | None] | None = None


@dataclasses.dataclass
class SampleOutput:
    """One finished sample.

    Attributes:
        index: 0 .. n - 1.
        token_ids: the generated tokens (a stop token is included, a stop string's tokens too).
        text: their text, ending before a stop string.
        logprobs, sampled_logprobs, top_logprobs: per generated token (see `Update`).
        finish_reason, stop_reason: see `Update`.
    """

    index: int
    token_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    logprobs: list[float] = dataclasses.field(default_factory=list)
    sampled_logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[TopLogprobs] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclasses.dataclass
class RequestOutput:
    """A whole request: its prompt, its samples and (when asked for) the prompt's log-probabilities."""

    request_id: str
    prompt_token_ids: list[int]
    samples: list[SampleOutput]
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[TopLogprobs | None] | None = None

    @property
    def finished(self) -> bool:
        return all(sample.finish_reason is not None for sample in self.samples)

    def apply(self, update: Update) -> None:
        """Fold one `Update` into this output."""
        sample = self.samples[update.index]
        sample.token_ids += update.token_ids
        sample.text += update.text
        sample.logprobs += update.logprobs
        sample.sampled_logprobs += update.sampled_logprobs
        sample.top_logprobs += update.top_logprobs
        if update.finish_reason is not None:
            sample.finish_reason, sample.stop_reason = update.finish_reason, update.stop_reason
        if update.prompt_logprobs is not None:
            self.prompt_logprobs = update.prompt_logprobs
            self.prompt_top_logprobs = update.prompt_top_logprobs


def run_to_end(
    engine: Any, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[RequestOutput]:
    """Run ``prompts`` to the end on ``engine`` (an `halyard.serve.Engine`, or anything with its ``add_request``
    and ``step``: `halyard.serve.Replicas`) and return their outputs (`Engine.generate`)."""
    settings = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(settings) != len(prompts):
        raise ValueError(f"generate got {len(prompts)} prompts but {len(settings)} sampling settings")
    outputs: dict[str, RequestOutput] = {}
    for prompt, setting in zip(prompts, settings):
        request_id = engine.add_request(prompt, setting)
        samples = [SampleOutput(index) for index in range(setting.n)]
        outputs[request_id] = RequestOutput(request_id, list(prompt), samples)
    while any(not output.finished for output in outputs.values()):
        for update in engine.step():
            if update.request_id in outputs:
                outputs[update.request_id].apply(update)
    return list(outputs.values())
