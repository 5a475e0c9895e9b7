"""Reading a cache: finished or still being built, local or in an object store, chunk by chunk."""

from __future__ import annotations

import bisect
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from halyard.data.cache.build_status import BuildStatus, BuildStatusReader
from halyard.data.cache.layout import chunk_mask_path, chunk_paths
from halyard.data.cache.ledger import ShardProgress, fingerprint, load_cache_ledger
from halyard.data.errors import CacheNotFoundError

_ENDS_CACHED = 64


@dataclass(frozen=True)
class _Chunk:
    shard_index: int
    chunk_index: int
    token_start: int
    tokens: int
    document_start: int
    documents: int


class TokenCache:
    """A token cache: one stream of tokens in the global order (shard index, chunk index).

    While a build runs, the readable part is the prefix made of every finished shard plus the committed
    chunks of the first unfinished one; it only grows, and it is always a prefix of the finished cache.
    Reads of tokens beyond it wait (printing what they wait for) until the builder commits them.
    """

    def __init__(self, root: str, ledger: dict[str, Any], wait_message_seconds: float, timeout: float | None):
        self.root = root.rstrip("/")
        self._fs, self._fs_root = fsspec.core.url_to_fs(self.root)
        self.identity: dict[str, Any] = ledger["identity"]
        self.wait_message_seconds = wait_message_seconds
        self.timeout = timeout
        self._ledger = ledger
        self._chunks: list[_Chunk] = []
        self._token_ends: list[int] = []
        self._document_ends: list[int] = []
        self._shards: list[ShardProgress] = []
        self._ends_cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._finished = False
        self._status = BuildStatusReader(self.root, len(self.identity["shards"]))
        # A background build in this process puts its failures here, so a waiting read raises them.
        self.build_errors: list[BaseException] = []
        self._last_wait_message = float("-inf")
        # Loader threads read concurrently; refreshes and the small ends cache are guarded.
        self._lock = threading.RLock()
        self.refresh()

    @classmethod
    def open(
        cls, path: str, *, wait_message_seconds: float = 10.0, timeout: float | None = None
    ) -> TokenCache:
        """Open the cache at ``path`` (a folder or fsspec URL), finished or still being built.

        Args:
            path: the cache folder given to ``build_cache``.
            wait_message_seconds: how often a waiting read prints what it waits for.
            timeout: seconds a read may wait for unwritten tokens before ``TimeoutError`` (None: forever).

        Raises:
            CacheNotFoundError: no cache ledger at ``path`` (a ``FileNotFoundError`` naming the path and how
                to build one).
        """
        ledger = load_cache_ledger(path)
        if ledger is None:
            raise CacheNotFoundError(
                f"no token cache at {path!r} (no ledger.json); build one with "
                "halyard.data.build_cache(...) or `python -m halyard.data build --out ...`"
            )
        return cls(path, ledger, wait_message_seconds, timeout)

    # ---- identity and totals -------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """A stable hash of what decides the cache's bytes (processor, sources, chunk size, format)."""
        return fingerprint(self.identity)

    @property
    def processor_metadata(self) -> dict[str, Any]:
        """Tokenizer hash, vocab size, BOS/EOS ids and tokens, token dtype, processor version."""
        return self.identity["processor"]

    @property
    def token_dtype(self) -> np.dtype:
        """The stored token dtype: little-endian ``uint16`` or ``uint32``."""
        return np.dtype(self.processor_metadata["token_dtype"]).newbyteorder("<")

    @property
    def has_loss_mask(self) -> bool:
        """True when the cache stores a per-token loss mask (built from chat or prompt/completion examples)."""
        return bool(self.processor_metadata.get("loss_mask", False))

    @property
    def is_finished(self) -> bool:
        """True once the builder wrote the finished ledger (no more tokens will appear)."""
        return self._finished

    @property
    def num_tokens(self) -> int:
        """Tokens readable now (the committed prefix; everything once finished)."""
        return self._token_ends[-1] if self._chunks else 0

    @property
    def num_documents(self) -> int:
        """Documents readable now."""
        return self._document_ends[-1] if self._chunks else 0

    @property
    def totals(self) -> dict[str, Any] | None:
        """The finished ledger's totals (tokens, documents, rows, chunks, bad-record counters), else None."""
        return self._ledger.get("totals")

    def build_status(self) -> BuildStatus:
        """How far the build has got over all shards (also those past the readable prefix)."""
        with self._lock:
            return self._status.read(self._finished)

    def shard_progress(self) -> list[ShardProgress]:
        """The progress of every shard that has committed something, in shard order."""
        return list(self._shards)

    # ---- progress --------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read the ledgers to pick up chunks committed since the last call."""
        if self._finished:
            return
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        if self._finished:
            return
        ledger = load_cache_ledger(self.root) or self._ledger
        self._ledger = ledger
        if ledger["finished"]:
            shards = [ShardProgress.from_json(value) for value in ledger["shard_progress"]]
            self._set_shards(shards, finished=True)
            return
        shards = [shard for shard in self._shards if shard.finished]
        for shard_index in range(len(shards), len(self.identity["shards"])):
            progress = ShardProgress.load(self.root, shard_index)
            if progress is None:
                break
            shards.append(progress)
            if not progress.finished:
                break
        self._set_shards(shards, finished=False)

    def _set_shards(self, shards: list[ShardProgress], finished: bool) -> None:
        # Chunk end positions (exclusive), so bisect_right(ends, position) is the chunk holding position.
        chunks: list[_Chunk] = []  # built aside, then swapped in (readers see old or new lists whole)
        token_ends: list[int] = []
        document_ends: list[int] = []
        for shard in shards:
            for chunk_index, entry in enumerate(shard.chunks):
                token_start = token_ends[-1] if token_ends else 0
                document_start = document_ends[-1] if document_ends else 0
                chunks.append(
                    _Chunk(
                        shard.shard_index,
                        chunk_index,
                        token_start,
                        entry.tokens,
                        document_start,
                        entry.documents,
                    )
                )
                token_ends.append(token_start + entry.tokens)
                document_ends.append(document_start + entry.documents)
        self._shards = shards
        self._chunks = chunks
        self._token_ends = token_ends
        self._document_ends = document_ends
        self._finished = finished

    def wait_for_tokens(self, count: int) -> int:
        """Block until ``count`` tokens are readable or the cache is finished; return the readable count.

        Prints what it waits for after a second, then every ``wait_message_seconds``.

        Raises:
            TimeoutError: after ``timeout`` seconds (when set), naming the cache and the counts.
        """
        return self.wait_until(lambda: self.num_tokens >= count, f"{count} tokens", tokens_needed=count)

    def wait_until_finished(self) -> None:
        """Block until the build wrote the finished ledger (printing progress while waiting)."""
        self.wait_until(
            lambda: False,
            "the finished cache (shuffle='feistel' permutes the whole cache and needs its size; "
            "shuffle='era' starts while the build runs)",
        )

    def wait_until(self, ready: Callable[[], bool], what: str, tokens_needed: int | None = None) -> int:
        """Refresh until ``ready()`` or the cache is finished; return the readable token count.

        Args:
            ready: the condition, checked after each refresh.
            what: what is awaited, for the message printed after a second and every ``wait_message_seconds``.
            tokens_needed: the readable tokens that satisfy ``ready`` (shown in the message), if known.

        Raises:
            TimeoutError: after ``timeout`` seconds (when set).
            the failure of a background build of this cache in this process (see ``build_errors``).
        """
        self.refresh()
        if ready() or self._finished:
            return self.num_tokens
        started = time.monotonic()
        next_message = started + min(1.0, self.wait_message_seconds)
        built_at_start = self.build_status().tokens
        pause = 0.02
        while not (ready() or self._finished):
            if self.build_errors:
                raise self.build_errors[0]
            now = time.monotonic()
            if self.timeout is not None and now - started > self.timeout:
                raise TimeoutError(
                    f"waited {self.timeout:.0f} s for {what} of the cache at {self.root}; only "
                    f"{self.num_tokens} tokens are committed and the build has not finished. Is a builder "
                    "running? Restart `python -m halyard.data build` with the same arguments to resume it."
                )
            if now >= next_message:
                next_message = now + self.wait_message_seconds
                with self._lock:  # threads waiting together print one message per period, not one each
                    quiet = now - self._last_wait_message < self.wait_message_seconds
                    self._last_wait_message = now if not quiet else self._last_wait_message
                if not quiet:
                    self._print_wait(what, tokens_needed, built_at_start, now - started)
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
            self.refresh()
        return self.num_tokens

    def _print_wait(self, what: str, tokens_needed: int | None, built_at_start: int, seconds: float) -> None:
        status = self.build_status()
        rate = (status.tokens - built_at_start) / max(seconds, 1e-9)
        missing = f", {tokens_needed - self.num_tokens} more than are readable" if tokens_needed else ""
        print(
            f"halyard.data: waiting for {what}{missing} of the cache at {self.root} for {seconds:.0f} s "
            f"({self.num_tokens} tokens readable, {status.tokens} built, {status.shards_finished}/"
            f"{status.shards} shards finished; the build writes {rate:,.0f} tokens/s)",
            file=sys.stderr,
            flush=True,
        )

    # ---- reading ----------------------------------------------------------------------------------------

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the stream (stored dtype), waiting for them while the build runs.

        Only the chunks overlapping the range are read, and only the needed byte range of each.

        Raises:
            IndexError: the range goes past the end of a finished cache (names both numbers).
            TimeoutError: see ``wait_for_tokens``.
        """
        return self._read_column(
            start, stop, self.token_dtype, lambda s, c: chunk_paths(self._fs_root, s, c)[0]
        )

    def read_loss_mask(self, start: int, stop: int) -> np.ndarray:
        """The loss mask of tokens ``[start, stop)``: ``uint8``, 1 where the token is a training target.

        Waits like ``read`` (a chunk's mask is published with its tokens).

        Raises:
            ValueError: the cache has no loss mask (it was built from plain text documents).
            IndexError, TimeoutError: see ``read``.
        """
        if not self.has_loss_mask:
            raise ValueError(
                f"the cache at {self.root} has no loss mask: it was built from text documents (every token "
                "is a target); build it with example_format='chat', 'prompt_completion' or 'preference' for one"
            )
        return self._read_column(
            start, stop, np.dtype(np.uint8), lambda s, c: chunk_mask_path(self._fs_root, s, c)
        )

    def _read_column(
        self, start: int, stop: int, dtype: np.dtype, path_of: Callable[[int, int], str]
    ) -> np.ndarray:
        if stop > self.num_tokens:
            self.wait_for_tokens(stop)
        if stop > self.num_tokens or start < 0 or start > stop:
            raise IndexError(
                f"tokens [{start}, {stop}) are outside the finished cache at {self.root}, which holds "
                f"{self.num_tokens} tokens"
            )
        parts = []
        position = start
        itemsize = dtype.itemsize
        while position < stop:
            chunk = self._chunks[bisect.bisect_right(self._token_ends, position)]
            local_start = position - chunk.token_start
            local_stop = min(stop, chunk.token_start + chunk.tokens) - chunk.token_start
            path = path_of(chunk.shard_index, chunk.chunk_index)
            raw = self._fs.cat_file(path, start=local_start * itemsize, end=local_stop * itemsize)
            parts.append(np.frombuffer(raw, dtype=dtype))
            position = chunk.token_start + local_stop
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    def document_ends(self, start: int, stop: int) -> np.ndarray:
        """Global positions (exclusive ends) of the documents ending inside ``(start, stop]``, ascending.

        A document's end is one past its EOS token. Waits like ``read``.
        """
        if stop > self.num_tokens:
            self.wait_for_tokens(stop)
        stop = min(stop, self.num_tokens)
        parts = []
        index = bisect.bisect_right(self._token_ends, start)
        while index < len(self._chunks) and self._chunks[index].token_start < stop:
            chunk = self._chunks[index]
            ends = self._chunk_ends(chunk) + chunk.token_start
            parts.append(ends[(ends > start) & (ends <= stop)])
            index += 1
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def document(self, index: int) -> np.ndarray:
        """The tokens of document ``index`` (with its BOS/EOS), waiting for it while the build runs.

        Raises:
            IndexError: past the last document of a finished cache.
        """
        return self.read(*self.document_span(index))

    def document_span(self, index: int) -> tuple[int, int]:
        """``(start, stop)``: the stream positions of document ``index`` (waits for it while the build runs).

        Raises:
            IndexError: past the last document of a finished cache.
        """
        self.wait_until(lambda: self.num_documents > index, f"document {index}")
        if index >= self.num_documents or index < 0:
            raise IndexError(
                f"document {index} is outside the cache, which holds {self.num_documents} documents"
            )
        chunk = self._chunks[bisect.bisect_right(self._document_ends, index)]
        ends = self._chunk_ends(chunk)
        local = index - chunk.document_start
        begin = 0 if local == 0 else int(ends[local - 1])
        return chunk.token_start + begin, chunk.token_start + int(ends[local])

    def document_at(self, position: int) -> tuple[int, int]:
        """``(document, offset)``: the index of the document holding stream position ``position`` and the
        position's offset inside it (0 at its first token). Waits like ``read``.

        Raises:
            IndexError: a position outside the finished cache.
        """
        if position >= self.num_tokens:
            self.wait_for_tokens(position + 1)
        if not 0 <= position < self.num_tokens:
            raise IndexError(
                f"token {position} is outside the cache at {self.root}, which holds {self.num_tokens} tokens"
            )
        chunk = self._chunks[bisect.bisect_right(self._token_ends, position)]
        local_position = position - chunk.token_start
        ends = self._chunk_ends(chunk)
        local = int(np.searchsorted(ends, local_position, side="right"))
        start = 0 if local == 0 else int(ends[local - 1])
        return chunk.document_start + local, local_position - start

    def document_source(self, index: int) -> tuple[dict[str, Any], int]:
        """``(source, number)``: the source shard document ``index`` was read from (as the ledger records it:
        ``url``, ``format``, ...) and the document's number among that shard's documents (0 for its first).

        Raises:
            IndexError: past the last document of a finished cache.
        """
        self.document_span(index)  # waits for it, or raises IndexError
        chunk = self._chunks[bisect.bisect_right(self._document_ends, index)]
        first = next(c.document_start for c in self._chunks if c.shard_index == chunk.shard_index)
        return dict(self.identity["shards"][chunk.shard_index]), index - first

    def _chunk_ends(self, chunk: _Chunk) -> np.ndarray:
        key = (chunk.shard_index, chunk.chunk_index)
        with self._lock:
            cached = self._ends_cache.get(key)
        if cached is None:
            _, ends_path = chunk_paths(self._fs_root, chunk.shard_index, chunk.chunk_index)
            cached = np.frombuffer(self._fs.cat_file(ends_path), dtype="<i8")
            with self._lock:
                self._ends_cache[key] = cached
                if len(self._ends_cache) > _ENDS_CACHED:
                    self._ends_cache.popitem(last=False)
        return cached
