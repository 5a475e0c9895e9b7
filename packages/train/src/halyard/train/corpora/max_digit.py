"""A verifiable task every machine can build: the largest digit of a string of digits (``grpo-demo``).

Each record is ``{"prompt": "7352>", "answer": "7"}``: four digits and a ``>``, answered by their largest
digit. A policy that answers at random is right about one time in twelve (digits and end-of-text), one that
always answers 9 about one time in three; attending to every digit and taking the largest is right every
time, and a tiny transformer learns it by reinforcement alone in a few hundred steps. The tokenizer has a
token per character (digits, ``>``) and ``<|endoftext|>``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

PROMPT_CORPORA = ("max-digit",)
"""The names ``data.builtin_corpus`` takes with ``data.format: prompts``."""
DIGITS = 4
END_OF_TEXT = "<|endoftext|>"


def write_max_digit_prompts(out_dir: str | Path, *, seed: int = 0) -> tuple[Path, Path]:
    """Write the task's prompts (``prompts.jsonl``: 9,000 strings of 4 digits) and its tokenizer (reused
    when present). Every process of a run may call it at once: each writes the same bytes to a file of its
    own, then renames it into place.

    Returns:
        ``(prompts.jsonl, tokenizer.json)``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts, tokenizer = out / "prompts.jsonl", out / "tokenizer.json"
    if not prompts.exists():
        order = np.random.default_rng(seed).permutation(10**DIGITS)
        lines = []
        for number in order[:9000]:
            digits = f"{int(number):0{DIGITS}d}"
            lines.append(json.dumps({"prompt": digits + ">", "answer": max(digits)}))
        temporary = prompts.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text("\n".join(lines) + "\n")
        temporary.replace(prompts)
    if not tokenizer.exists():
        vocabulary = {END_OF_TEXT: 0, **{str(d): d + 1 for d in range(10)}, ">": 11}
        built = Tokenizer(models.WordLevel(vocabulary, unk_token=END_OF_TEXT))
        built.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        built.decoder = decoders.Fuse()
        built.add_special_tokens([END_OF_TEXT])
        temporary = tokenizer.with_suffix(f".{os.getpid()}.tmp")
        built.save(str(temporary))
        temporary.replace(tokenizer)
    return prompts, tokenizer
