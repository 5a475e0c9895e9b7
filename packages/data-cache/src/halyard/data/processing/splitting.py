"""Split very long documents where the tokenizer would split anyway, so pieces rejoin to the same tokens."""

from __future__ import annotations


def safe_split(text: str, max_chars: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_chars`` characters at tokenizer-safe places.

    A cut goes right before a single space that sits between two non-space characters (``"foo| bar"``):
    byte-level BPE (GPT-2/Llama-3 style) and Metaspace pre-tokenizers start a new pre-token there, and
    merges never cross pre-tokens, so tokenizing the pieces and concatenating equals tokenizing the whole.
    Without such a space in the second half of the window the cut falls after a newline, and only
    without either (one 100k-character word) at the hard limit.

    Args:
        text: the document.
        max_chars: the largest piece, in characters (at least 2).

    Returns:
        Pieces whose concatenation is ``text``.
    """
    if max_chars < 2:
        raise ValueError(f"max_chars must be at least 2, got {max_chars}")
    pieces = []
    start = 0
    while len(text) - start > max_chars:
        limit = start + max_chars
        low = start + max_chars // 2
        cut = _last_safe_space(text, low, limit)
        if cut is None:
            newline = text.rfind("\n", low, limit)
            cut = newline + 1 if newline >= 0 else limit
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _last_safe_space(text: str, low: int, high: int) -> int | None:
    position = text.rfind(" ", low, high)
    while position > low:
        before, after = text[position - 1], text[position + 1] if position + 1 < len(text) else " "
        if not before.isspace() and not after.isspace():
            return position
        position = text.rfind(" ", low, position)
    return None
