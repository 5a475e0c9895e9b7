"""The processor: documents -> token ids with the BOS/EOS policy, batched through the fast tokenizer."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from halyard.data.processing.policy import SpecialTokenPolicy, detect_policy
from halyard.data.processing.splitting import safe_split
from halyard.data.processing.tokenizer import TokenizerSpec, load_tokenizer

# Bumped whenever the bytes a processor produces for the same input could change.
PROCESSOR_VERSION = 1
# Pieces of a long document tokenized together: bounds the memory of the tokenizer's Encoding objects.
_PIECES_PER_CALL = 8


@dataclass(frozen=True)
class Processor:
    """Turns documents into a flat token stream; picklable, so it travels to worker processes and Ray tasks.

    Attributes:
        tokenizer: the tokenizer in serialized form.
        policy: which BOS/EOS tokens surround each document.
        split_chars: documents longer than this many characters are split (``safe_split``), tokenized
            piece by piece and rejoined, which bounds worker memory for huge documents.
        loss_mask: the cache stores a per-token loss mask next to the tokens (set when some source holds
            chat or prompt/completion examples; see ``encode_examples``).
    """

    tokenizer: TokenizerSpec
    policy: SpecialTokenPolicy
    split_chars: int = 100_000
    loss_mask: bool = False

    @classmethod
    def create(
        cls,
        tokenizer: Any,
        *,
        bos: bool | str = "auto",
        eos: bool | str = "auto",
        split_chars: int = 100_000,
        loss_mask: bool = False,
    ) -> Processor:
        """Load a tokenizer and detect its BOS/EOS policy (see ``load_tokenizer`` and ``detect_policy``).

        Args:
            tokenizer: a tokenizer.json path/URL, a tokenizer folder, or a tokenizer object.
            bos: ``"auto"``, ``True``, ``False`` or a token string.
            eos: ``"auto"`` or a token string.
            split_chars: see the class attribute.
            loss_mask: see the class attribute.

        Raises:
            ValueError, FileNotFoundError, TypeError: from loading or policy detection.
        """
        spec = load_tokenizer(tokenizer)
        policy = detect_policy(
            spec.build(), bos=bos, eos=eos, declared_bos=spec.bos_token, declared_eos=spec.eos_token
        )
        return cls(spec, policy, split_chars, loss_mask)

    @property
    def backend(self) -> Tokenizer:
        """The ``tokenizers.Tokenizer`` (built once per process)."""
        return self.tokenizer.build()

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def token_dtype(self) -> np.dtype:
        """``uint16`` when every id fits, else ``uint32``."""
        return np.dtype(np.uint16) if self.vocab_size <= 2**16 else np.dtype(np.uint32)

    def metadata(self) -> dict[str, Any]:
        """What identifies the bytes this processor produces; stored in the ledger and compared on reuse."""
        metadata = {
            "processor_version": PROCESSOR_VERSION,
            "tokenizer_sha256": self.tokenizer.sha256,
            "vocab_size": self.vocab_size,
            **self.policy.describe(),
            "split_chars": self.split_chars,
            "token_dtype": self.token_dtype.name,
        }
        if self.loss_mask:  # absent for text caches, so their identity is what it was before masks existed
            metadata["loss_mask"] = True
        return metadata

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Tokenize documents into one stream ``[bos] content [eos] [bos] content [eos] ...``.

        Args:
            texts: the documents, in order (non-empty strings).

        Returns:
            ``(tokens, lengths)``: tokens ``[total] uint32`` and the length of each document ``[len(texts)]
            int64`` including its BOS/EOS.
        """
        short = [text for text in texts if len(text) <= self.split_chars]
        encoded_short = self.backend.encode_batch_fast(short, add_special_tokens=False) if short else []
        if len(short) == len(texts):
            contents: list[Any] = [encoding.ids for encoding in encoded_short]
        else:
            short_iter = iter(encoded_short)
            contents = [
                next(short_iter).ids if len(text) <= self.split_chars else self._encode_long(text)
                for text in texts
            ]
        return self._add_special_tokens(contents)

    def encode_examples(
        self, examples: list[tuple[tuple[str, bool], ...]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokenize examples into one stream with a loss mask: ``[bos] piece piece ... [eos]`` per example.

        Every piece is tokenized on its own (without the tokenizer's special tokens) and the ids are
        concatenated, so an example's target tokens are exactly the tokens of its target pieces. The BOS
        is never a target; the EOS is a target when the last piece is (the model learns to stop after the
        completion). As in ``encode``, no BOS/EOS is added when the text already starts/ends with it.

        Args:
            examples: each a tuple of ``(text, is_target)`` pieces (a plain document is one target piece).

        Returns:
            ``(tokens, lengths, loss_mask)``: tokens ``[total] uint32``, the length of each example
            ``[len(examples)] int64`` including its BOS/EOS, and ``[total] uint8`` 1 on target tokens.
        """
        pieces = [text for example in examples for text, _ in example if text]
        short = [text for text in pieces if len(text) <= self.split_chars]
        short_ids = iter(
            [encoding.ids for encoding in self.backend.encode_batch_fast(short, add_special_tokens=False)]
            if short
            else []
        )
        token_parts: list[np.ndarray] = []
        mask_parts: list[np.ndarray] = []
        lengths = np.zeros(len(examples), np.int64)
        bos_id, eos_id = self.policy.bos_id, self.policy.eos_id
        for index, example in enumerate(examples):
            ids_parts, target_parts = [], []
            last_target = False
            for text, target in example:
                if not text:
                    continue
                ids = np.asarray(
                    next(short_ids) if len(text) <= self.split_chars else self._encode_long(text), np.uint32
                )
                ids_parts.append(ids)
                target_parts.append(np.full(ids.size, target, np.uint8))
                last_target = target
            ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.uint32)
            mask = np.concatenate(target_parts) if target_parts else np.zeros(0, np.uint8)
            if bos_id is not None and not (ids.size and ids[0] == bos_id):
                ids = np.concatenate([np.asarray([bos_id], np.uint32), ids])
                mask = np.concatenate([np.zeros(1, np.uint8), mask])
            if not (ids.size and ids[-1] == eos_id):
                ids = np.concatenate([ids, np.asarray([eos_id], np.uint32)])
                mask = np.concatenate([mask, np.asarray([last_target], np.uint8)])
            token_parts.append(ids)
            mask_parts.append(mask)
            lengths[index] = ids.size
        if not token_parts:
            return np.zeros(0, np.uint32), lengths, np.zeros(0, np.uint8)
        return np.concatenate(token_parts), lengths, np.concatenate(mask_parts)

    def _encode_long(self, text: str) -> np.ndarray:
        pieces = safe_split(text, self.split_chars)
        parts = []
        for first in range(0, len(pieces), _PIECES_PER_CALL):
            group = pieces[first : first + _PIECES_PER_CALL]
            for encoding in self.backend.encode_batch_fast(group, add_special_tokens=False):
                parts.append(np.asarray(encoding.ids, dtype=np.uint32))
        return np.concatenate(parts) if parts else np.zeros(0, np.uint32)

    def _add_special_tokens(self, contents: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        count = len(contents)
        content_lengths = np.fromiter(map(len, contents), dtype=np.int64, count=count)
        if all(isinstance(content, list) for content in contents):
            flat = np.fromiter(
                itertools.chain.from_iterable(contents), dtype=np.uint32, count=int(content_lengths.sum())
            )
        else:
            flat = np.concatenate([np.asarray(content, np.uint32) for content in contents])
        content_starts = np.concatenate([[0], np.cumsum(content_lengths)[:-1]]).astype(np.int64)
        nonempty = content_lengths > 0
        last_index = np.clip(content_starts + content_lengths - 1, 0, max(flat.size - 1, 0))
        first_index = np.minimum(content_starts, max(flat.size - 1, 0))
        eos_id, bos_id = self.policy.eos_id, self.policy.bos_id
        ends_with_eos = nonempty & (flat[last_index] == eos_id) if flat.size else np.zeros(count, bool)
        add_eos = (~ends_with_eos).astype(np.int64)
        if bos_id is None:
            add_bos = np.zeros(count, np.int64)
        else:
            starts_with_bos = nonempty & (flat[first_index] == bos_id) if flat.size else np.zeros(count, bool)
            add_bos = (~starts_with_bos).astype(np.int64)
        lengths = content_lengths + add_bos + add_eos
        out_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        tokens = np.empty(int(lengths.sum()), np.uint32)
        shift = np.repeat(out_starts + add_bos - content_starts, content_lengths)
        tokens[np.arange(flat.size, dtype=np.int64) + shift] = flat
        if bos_id is not None:
            tokens[out_starts[add_bos == 1]] = bos_id
        tokens[(out_starts + lengths - 1)[add_eos == 1]] = eos_id
        return tokens, lengths
