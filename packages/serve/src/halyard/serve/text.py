"""`SampleText`: a sample's generated tokens as text, cut at a stop string, streamed only when safe."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]
"""Token ids -> text (special tokens left out), e.g. ``lambda ids: tokenizer.decode(ids)``."""

REPLACEMENT = "\ufffd"


class SampleText:
    """The text of one sample as its tokens arrive.

    The whole text is decoded again after every token (a tokenizer joins pieces differently at word
    boundaries, so per-token pieces would not add up to it). A stop string ends the text where it starts.
    `stream` hands out only text that can no longer change: nothing that could still grow into a stop
    string, and nothing that ends in half a character (a multi-byte character split over tokens decodes
    to U+FFFD until its last byte arrives).

    Args:
        decode: the tokenizer's decode.
        stop: the request's stop strings.
    """

    def __init__(self, decode: Decode, stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = tuple(stop)
        self._longest_stop = max((len(s) for s in self._stop), default=0)
        self.text = ""
        self.stopped_by: str | None = None
        self._streamed = 0

    def update(self, tokens: Sequence[int]) -> bool:
        """Take the sample's generated tokens so far; True when a stop string appeared (the text then
        ends before it and stays so)."""
        if self.stopped_by is not None:
            return True
        previous = len(self.text)
        self.text = self._decode(tokens)
        if self._stop:
            search_from = max(0, min(previous, len(self.text)) - self._longest_stop)
            found = [(self.text.find(s, search_from), s) for s in self._stop]
            found = [(index, s) for index, s in found if index >= 0]
            if found:
                index, stop = min(found)
                self.text = self.text[:index]
                self.stopped_by = stop
                return True
        return False

    def stream(self, final: bool = False) -> str:
        """The text not streamed before that is safe to send now (everything left when ``final``)."""
        end = len(self.text)
        if not final and self.stopped_by is None:
            end = self._safe_end()
        end = max(end, self._streamed)
        delta = self.text[self._streamed : end]
        self._streamed = end
        return delta

    def _safe_end(self) -> int:
        end = len(self.text)
        while end > self._streamed and self.text[end - 1] == REPLACEMENT:
            end -= 1
        held = 0  # the longest end of the text that a stop string starts with
        for stop in self._stop:
            for length in range(min(len(stop) - 1, end), held, -1):
                if self.text.endswith(stop[:length], 0, end):
                    held = length
                    break
        return end - held
