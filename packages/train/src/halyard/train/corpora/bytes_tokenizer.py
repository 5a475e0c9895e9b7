"""``data.tokenizer: bytes``: a tokenizer with a token per byte (and ``<|endoftext|>``), shipped with the
package, for runs on built-in corpora that should not train a tokenizer first (``doremi-demo``: a mixture's
sources share one tokenizer, and random characters stay random characters)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

BYTES = "bytes"
"""The ``data.tokenizer`` value naming the byte tokenizer."""
BYTES_TOKENIZER_FILE = Path(__file__).with_name("bytes_tokenizer.json")
"""The shipped tokenizer.json (`write_bytes_tokenizer` wrote it)."""
END_OF_TEXT = "<|endoftext|>"


def tokenizer_file(name: str) -> str:
    """The tokenizer file ``data.tokenizer`` means: the shipped byte tokenizer for ``bytes``, else ``name``."""
    return str(BYTES_TOKENIZER_FILE) if name == BYTES else name


def write_bytes_tokenizer(path: str | Path) -> Path:
    """Write the byte tokenizer: ``<|endoftext|>`` is id 0 (the EOS the cache appends), the 256 bytes ids
    1-256 in byte order (as GPT-2's byte-level alphabet spells them)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)
    vocabulary = {END_OF_TEXT: 0, **{symbol: index + 1 for index, symbol in enumerate(alphabet)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocabulary, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([END_OF_TEXT])
    tokenizer.save(str(path))
    return Path(path)


def _byte_of(symbol: str) -> int:
    """The byte GPT-2's byte-level alphabet spells as ``symbol``."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    if ord(symbol) in printable:
        return ord(symbol)
    others = [byte for byte in range(256) if byte not in printable]
    return others[ord(symbol) - 256]
