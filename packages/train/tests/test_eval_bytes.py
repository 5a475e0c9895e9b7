"""`target_bytes`: bits per byte divide by the bytes of the labels the loss counts, and only those."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from halyard.train.objectives.lm_evaluate import target_bytes


def _byte_tokenizer() -> Tokenizer:
    """Token id ``i`` is the single character ``chr(97 + i)`` (a..z), so each label is one byte."""
    vocab = {chr(97 + i): i for i in range(26)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # concatenate tokens (no spaces between them)
    return tokenizer


def test_every_label_counts_without_segments_or_mask() -> None:
    tokens = np.arange(10).reshape(2, 5)
    assert target_bytes(_byte_tokenizer(), [{"tokens": tokens}]) == 8.0  # 2 rows x 4 labels


def test_labels_across_a_document_boundary_and_outside_the_mask_do_not_count() -> None:
    tokens = np.array([[0, 1, 2, 3, 4, 5]])
    segments = np.array([[0, 0, 0, 1, 1, 1]])  # label 3 (input 2) crosses the boundary
    loss_mask = np.array([[1, 1, 0, 1, 1, 1]])  # label 2 is a prompt token
    batch = {"tokens": tokens, "segment_ids": segments, "loss_mask": loss_mask}
    # labels 1..5: 1 counts, 2 masked, 3 crosses documents, 4 and 5 count -> "b" + "ef" = 3 bytes
    assert target_bytes(_byte_tokenizer(), [batch]) == 3.0


def test_runs_decode_whole_so_multibyte_characters_are_not_split() -> None:
    tokenizer = Tokenizer(models.WordLevel({"é": 0, "x": 1}, unk_token="x"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokens = np.array([[1, 0, 0, 1]])
    assert target_bytes(tokenizer, [{"tokens": tokens, "loss_mask": np.array([[1, 1, 0, 1]])}]) == 3.0
