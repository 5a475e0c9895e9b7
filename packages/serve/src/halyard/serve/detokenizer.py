"""`Detokenizer`: the engine's token-level `Update` s given their text, samples ended at their stop strings.

The engine thread only steps: its updates carry token ids and the endings it decides itself (a stop token,
``max_tokens``, a cancellation). Decoding the ids into text and finding stop strings runs wherever the
updates are consumed: `halyard.serve.Engine.step` itself by default, the server's event loop once the
engine handed its text off (`Engine.hand_off_text`). There a stop string is found after the engine may
already have drawn a token or two past it: the detokenizer asks the engine to end the sample
(`StopString`, `Engine.stop_sample`) and drops every later update of that sample, so a caller sees exactly
what an engine that checked stop strings itself would show.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from halyard.serve.outputs import Update
from halyard.serve.text import Decode, SampleText


class StopString(NamedTuple):
    """A sample that a stop string ended: the engine should stop drawing for it (`Engine.stop_sample`)."""

    request_id: str
    sample: int
    stop: str


@dataclasses.dataclass
class _SampleText:
    text: SampleText
    tokens: list[int] = dataclasses.field(default_factory=list)  # generated, without the stop token
    shown_finished: bool = False  # its end was handed out: later updates are dropped
    engine_finished: bool = False  # the engine ended it: no update of it comes again


class Detokenizer:
    """The text of every sample of the requests it was told of (`add`).

    Args:
        decode: the tokenizer's decode (token ids -> text, special tokens left out).
    """

    def __init__(self, decode: Decode):
        self.decode = decode
        self._samples: dict[str, list[_SampleText]] = {}

    def add(self, request_id: str, samples: int, stop: tuple[str, ...]) -> None:
        """Follow a new request of ``samples`` samples whose text ends at any of the strings ``stop``."""
        self._samples[request_id] = [_SampleText(SampleText(self.decode, stop)) for _ in range(samples)]

    def forget(self, request_id: str) -> None:
        """Stop following a request (cancelled: nobody reads its updates); unknown ids are ignored."""
        self._samples.pop(request_id, None)

    def __len__(self) -> int:
        """How many requests it follows."""
        return len(self._samples)

    def process(self, updates: list[Update]) -> tuple[list[Update], list[StopString]]:
        """Give ``updates`` (in the order the engine made them) their text.

        Returns:
            The updates to hand out (an update of a request it does not follow is passed on unchanged;
            one of a sample that already ended here is dropped), and the samples a stop string ended.
        """
        shown: list[Update] = []
        stops: list[StopString] = []
        for update in updates:
            samples = self._samples.get(update.request_id)
            if samples is None:
                shown.append(update)
                continue
            sample = samples[update.index]
            if update.finish_reason is not None:
                sample.engine_finished = True
                if all(s.engine_finished for s in samples):
                    del self._samples[update.request_id]
            if sample.shown_finished:
                continue
            stopped_here = self._add_text(update, sample)
            if stopped_here and not sample.engine_finished:
                stops.append(StopString(update.request_id, update.index, update.stop_reason))  # type: ignore[arg-type]
            sample.shown_finished = update.finish_reason is not None
            shown.append(update)
        return shown, stops

    @staticmethod
    def _add_text(update: Update, sample: _SampleText) -> bool:
        """Set ``update.text`` (and its ending when a stop string appeared); True when one did.

        The tokens are taken one at a time, however many one update carries: a step that absorbs two
        programs hands a sample two tokens at once (the one its pipelined step drew, then its own), and the
        text and ending must be those of the same tokens arriving one an update. A stop token's text is
        left out but every token before it counts; a stop string ends the update at the token that
        completed it (its later tokens are dropped, as the updates after it are)."""
        stop_token = update.finish_reason == "stop" and isinstance(update.stop_reason, int)
        texts = update.token_ids[:-1] if stop_token else update.token_ids
        for count, token in enumerate(texts, start=1):
            sample.tokens.append(token)
            if sample.text.update(sample.tokens):
                _keep_tokens(update, count)
                update.finish_reason, update.stop_reason = "stop", sample.text.stopped_by
                update.text = sample.text.stream(final=True)
                return True
        update.text = sample.text.stream(final=update.finish_reason is not None)
        return False


def _keep_tokens(update: Update, count: int) -> None:
    """Cut ``update`` to its first ``count`` tokens."""
    del update.token_ids[count:], update.logprobs[count:], update.sampled_logprobs[count:]
    del update.top_logprobs[count:]
