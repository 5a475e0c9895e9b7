"""Tokenize one shard into chunks, resuming from its ledger: the unit of work of every builder."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from halyard.data.cache.layout import chunk_mask_path, chunk_paths, remove_temporaries, write_atomic
from halyard.data.cache.ledger import ChunkEntry, ShardProgress
from halyard.data.processing.processor import Processor
from halyard.data.sources.records import Record
from halyard.data.sources.shards import ShardSpec, read_shard

_FIRST_BATCH_CHARS = 1 << 15


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs for one shard (picklable).

    Attributes:
        root: the cache folder or URL.
        shard_index: position of the shard in the cache's global order.
        shard: what to read.
        chunk_tokens: a chunk is closed at the first document boundary at or after this many tokens.
        first_chunk_tokens: the first chunk of a shard targets this many tokens and each next one twice
            as many, up to ``chunk_tokens``: the first batch is readable soon after the build starts, while
            later chunks stay large.
        strict: fail on bad records instead of skipping and counting.
        described: the shard as the cache's identity records it (default ``shard.describe()``).
        batch_chars: documents are tokenized in batches of about this many characters.
    """

    root: str
    shard_index: int
    shard: ShardSpec
    chunk_tokens: int
    first_chunk_tokens: int
    strict: bool
    batch_chars: int = 1 << 20
    described: dict[str, Any] | None = None


def build_shard(job: ShardJob, processor: Processor) -> ShardProgress:
    """Tokenize ``job.shard`` into chunks, continuing from its saved progress.

    Chunk boundaries depend only on the documents (never on timing or batching), so a resumed shard
    writes the same bytes as an uninterrupted one. Each chunk's files are published before the shard
    ledger that lists them; memory stays under one chunk plus one batch of documents.

    Args:
        job: the shard and the cache settings.
        processor: the tokenizer and BOS/EOS policy.

    Returns:
        The shard's final progress (finished).

    Raises:
        whatever reading the shard raises (missing file, bad record under ``strict``, missing field).
    """
    progress = ShardProgress.load(job.root, job.shard_index)
    if progress is None:
        progress = ShardProgress(job.shard_index, job.described or job.shard.describe())
    if progress.finished:
        return progress
    remove_temporaries(job.root, job.shard_index)
    writer = _ChunkWriter(job, processor, progress)
    for batch in _batches(read_shard(job.shard, progress.rows_done, strict=job.strict), job.batch_chars):
        writer.add_batch(batch)
    writer.finish()
    return progress


def _batches(records: Iterator[Record], batch_chars: int) -> Iterator[list[Record]]:
    # Batches start small and double up to batch_chars, so the first chunk of a shard is committed soon
    # after the worker starts (tokens never depend on batching, only the latency does).
    budget = min(_FIRST_BATCH_CHARS, batch_chars)
    batch: list[Record] = []
    characters = 0
    for record in records:
        batch.append(record)
        if record.text is not None:
            characters += len(record.text)
        elif record.segments is not None:
            characters += sum(len(text) for text, _ in record.segments + (record.rejected or ()))
        if characters >= budget:
            yield batch
            batch, characters = [], 0
            budget = min(2 * budget, batch_chars)
    if batch:
        yield batch


class _ChunkWriter:
    """Accumulates tokenized documents and commits a chunk at the first document boundary past the target."""

    def __init__(self, job: ShardJob, processor: Processor, progress: ShardProgress) -> None:
        self.job = job
        self.processor = processor
        self.progress = progress
        self.dtype = processor.token_dtype
        self.token_parts: list[np.ndarray] = []
        self.length_parts: list[np.ndarray] = []
        self.mask_parts: list[np.ndarray] = []
        self.buffered_tokens = 0
        # Bad-record counts not yet in the ledger, grouped by the document that follows them (its row and
        # the counts of the rows up to it): a commit ending at a document takes the groups up to it. Memory
        # grows with the buffered documents, never with the number of bad rows.
        self.pending_groups: deque[tuple[int, Counter[str]]] = deque()
        self.trailing_issues: Counter[str] = Counter()
        self.rows_seen = progress.rows_done

    def add_batch(self, batch: list[Record]) -> None:
        documents = []
        for record in batch:
            if record.issue is not None:
                self.trailing_issues[record.issue] += 1
            if record.text is not None or record.segments is not None:
                documents.append(record)
                self.pending_groups.append((record.row, self.trailing_issues))
                self.trailing_issues = Counter()
        self.rows_seen = batch[-1].row + 1
        if not documents:
            return
        mask: np.ndarray | None = None
        if self.processor.loss_mask:
            # A plain document in a cache with masks is one target piece: every token is trained on.
            examples = []
            for record in documents:
                examples.append(
                    record.segments if record.segments is not None else ((record.text or "", True),)
                )
                if record.rejected is not None:
                    examples.append(record.rejected)
            tokens, lengths, mask = self.processor.encode_examples(examples)
        else:
            tokens, lengths = self.processor.encode([record.text for record in documents])  # type: ignore[misc]
        rows = np.fromiter((record.row for record in documents), dtype=np.int64, count=len(documents))
        # A record is one cache document, or two for a preference pair (chosen, rejected). Chunks end only
        # between records, so a pair is never split by a commit (a resumed shard restarts at a record).
        record_documents = np.cumsum([1 if record.rejected is None else 2 for record in documents])
        ends = np.cumsum(lengths)[record_documents - 1]
        first = 0
        while first < len(documents):
            consumed_before = int(ends[first - 1]) if first else 0
            needed = self._target_tokens() - self.buffered_tokens
            last = int(np.searchsorted(ends, consumed_before + needed, side="left"))
            stop = min(last + 1, len(documents))
            self.token_parts.append(tokens[consumed_before : int(ends[stop - 1])])
            if mask is not None:
                self.mask_parts.append(mask[consumed_before : int(ends[stop - 1])])
            first_document = int(record_documents[first - 1]) if first else 0
            self.length_parts.append(lengths[first_document : int(record_documents[stop - 1])])
            self.buffered_tokens += int(ends[stop - 1]) - consumed_before
            if last < len(documents):
                self._commit(rows_end=int(rows[last]) + 1, finished=False)
            first = stop

    def _target_tokens(self) -> int:
        growth = min(len(self.progress.chunks), 40)
        return min(self.job.chunk_tokens, self.job.first_chunk_tokens << growth)

    def finish(self) -> None:
        self._commit(rows_end=self.rows_seen, finished=True)

    def _commit(self, rows_end: int, finished: bool) -> None:
        progress = self.progress
        if self.buffered_tokens:
            tokens = np.concatenate(self.token_parts).astype(self.dtype.newbyteorder("<"), copy=False)
            lengths = np.concatenate(self.length_parts)
            chunk_index = len(progress.chunks)
            tokens_path, ends_path = chunk_paths(self.job.root, self.job.shard_index, chunk_index)
            write_atomic(tokens_path, tokens.tobytes())
            write_atomic(ends_path, np.cumsum(lengths).astype("<i8").tobytes())
            if self.processor.loss_mask:
                mask = np.concatenate(self.mask_parts).astype(np.uint8, copy=False)
                write_atomic(
                    chunk_mask_path(self.job.root, self.job.shard_index, chunk_index), mask.tobytes()
                )
            progress.chunks.append(ChunkEntry(int(tokens.size), int(lengths.size), rows_end))
        while self.pending_groups and self.pending_groups[0][0] < rows_end:
            for name, count in self.pending_groups.popleft()[1].items():
                progress.counters[name] = progress.counters.get(name, 0) + count
        if finished:
            for name, count in self.trailing_issues.items():
                progress.counters[name] = progress.counters.get(name, 0) + count
        progress.rows_done = rows_end
        progress.finished = finished
        progress.save(self.job.root)
        self.token_parts, self.length_parts, self.mask_parts, self.buffered_tokens = [], [], [], 0


def shard_is_finished(root: str, shard_index: int) -> bool:
    """True when the shard's ledger says it is finished."""
    progress = ShardProgress.load(root, shard_index)
    return progress is not None and progress.finished


def ensure_folder(root: str) -> None:
    """Create the cache folder (a no-op on object stores without folders)."""
    fs, path = fsspec.core.url_to_fs(root)
    fs.makedirs(path, exist_ok=True)
