"""Where a row of a training batch comes from: its example, window, stream position and documents.

    example_position(data.train, step=30, row=3, batch_size=8)
    # {"row": 3, "example": 243, "window": 243, "token": 7776,
    #  "documents": [{"document": 57, "offset": 0, "tokens": 33, "source": ".../part-00.jsonl", "number": 12}]}

A batch is a pure function of (manifest, seed, step) (`halyard.data.host_rows`): example ``step * batch_size
+ row`` of the split, which the shuffle maps to a window of ``seq_len + 1`` tokens of the cache's stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from halyard.data import LMDataset
from halyard.train.data_assembly.mixture_batches import SourceMixture


def example_position(train: Any, *, step: int, row: int, batch_size: int) -> dict[str, Any] | None:
    """The data position of ``row`` of the global batch of ``step`` (0-based, as the loader counts).

    Args:
        train: the run's training split (`LMDataset` or `SourceMixture`; other datasets give None).
        step: the loader's step (the logged step minus one).
        row: the row of the global batch.
        batch_size: ``trainer.batch_size``.

    Returns:
        ``row``, ``example`` (index in the split, or in its source for a mixture, with ``source``), ``window``,
        ``token`` (stream position of the row's first token) and ``documents``: each document the row's
        ``seq_len + 1`` tokens touch, with ``document`` (index in the cache), ``offset`` (of the row's first
        token of it inside it), ``tokens`` (how many of the row's tokens are its), ``source`` (the shard's url)
        and ``number`` (the document's number in that shard).
    """
    example = step * batch_size + row
    position: dict[str, Any] = {"row": row}
    dataset = train
    if isinstance(train, SourceMixture):
        components, local = train.rows_for(batch_size).assignments(np.array([example]), batch_size)
        name = train.names[int(components[0])]
        dataset, example = train.datasets[name], int(local[0])
        position["source"] = name
    if not isinstance(dataset, LMDataset):
        return None
    window = int(dataset.windows(np.array([example]))[0])
    start = window * dataset.seq_len
    position.update(example=example, window=window, token=start, documents=_documents(dataset, start))
    return position


def _documents(dataset: LMDataset, start: int) -> list[dict[str, Any]]:
    cache, stop = dataset.cache, start + dataset.seq_len + 1
    documents, position = [], start
    while position < stop:
        document, offset = cache.document_at(position)
        _, document_stop = cache.document_span(document)
        tokens = min(document_stop, stop) - position
        source, number = cache.document_source(document)
        documents.append(
            {
                "document": document,
                "offset": offset,
                "tokens": tokens,
                "source": source.get("url", str(source)),
                "number": number,
            }
        )
        position += tokens
    return documents
