"""Tokenizer files next to an exported model: what to copy, the vocabulary size and the special ids.

A tokenizer is a ``tokenizer.json`` (the `tokenizers` library's format) or a folder holding one, perhaps
with ``tokenizer_config.json`` / ``special_tokens_map.json`` naming BOS/EOS/pad. Those files are read as
JSON (no `transformers` needed). When no ``tokenizer_config.json`` comes with it, one is written that lets
``AutoTokenizer.from_pretrained`` load the folder as a ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# Files a tokenizer folder may hold that belong next to the model; copied as they are when present.
COMPANION_FILES = (
    TOKENIZER_CONFIG,
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)

# Well-known special-token spellings, tried in order when no config names the token.
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]")


def _token_text(value: Any) -> str | None:
    """A special token as configs spell it: a string or an AddedToken-like ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True)
class TokenizerInfo:
    """A tokenizer found on disk.

    Attributes:
        tokenizer_json: path of ``tokenizer.json``.
        companions: other tokenizer files to copy (``tokenizer_config.json``...).
        vocab_size: number of token ids (highest id + 1, added tokens included).
        token_ids: every token string -> id (vocabulary and added tokens).
        special: ``{"bos": token, "eos": token, "pad": token}`` for those the files name or that have a
            well-known spelling (missing ones are absent).
    """

    tokenizer_json: Path
    companions: tuple[Path, ...]
    vocab_size: int
    token_ids: dict[str, int]
    special: dict[str, str]

    def special_id(self, role: str) -> int | None:
        """The id of the ``role`` (``bos``/``eos``/``pad``) token, None when unknown."""
        token = self.special.get(role)
        return None if token is None else self.token_ids[token]

    def token_of(self, token_id: int) -> str | None:
        """The string of ``token_id`` (None when no token has it)."""
        return next((token for token, i in self.token_ids.items() if i == token_id), None)


def read_tokenizer(path: str | Path) -> TokenizerInfo:
    """Find a tokenizer at ``path`` (a ``tokenizer.json`` or a folder holding one) and read its ids.

    Raises:
        FileNotFoundError: no ``tokenizer.json`` there.
        ValueError: the file is not a `tokenizers` JSON (no ``model`` object).
    """
    path = Path(path)
    tokenizer_json = path / TOKENIZER_JSON if path.is_dir() else path
    if not tokenizer_json.is_file():
        raise FileNotFoundError(
            f"no tokenizer at {path}: give the path of a tokenizer.json or of a folder that holds one"
        )
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    if "model" not in data:
        raise ValueError(f"{tokenizer_json} is not a tokenizers JSON file (it has no 'model' object)")
    vocab = data["model"].get("vocab") or {}
    token_ids: dict[str, int] = (
        dict(vocab) if isinstance(vocab, dict) else {entry[0]: i for i, entry in enumerate(vocab)}
    )
    added = data.get("added_tokens") or []
    for entry in added:
        token_ids[entry["content"]] = int(entry["id"])
    folder = tokenizer_json.parent
    companions = tuple(folder / name for name in COMPANION_FILES if (folder / name).is_file())
    special: dict[str, str] = {}
    for companion in companions:
        if companion.suffix == ".json" and companion.name != "added_tokens.json":
            declared = json.loads(companion.read_text(encoding="utf-8"))
            for role in ("bos", "eos", "pad"):
                token = _token_text(declared.get(f"{role}_token"))
                if token is not None and token in token_ids:
                    special.setdefault(role, token)
    specials = [entry["content"] for entry in added if entry.get("special")]
    for role, names in (("eos", EOS_NAMES), ("bos", BOS_NAMES), ("pad", PAD_NAMES)):
        if role not in special:
            found = next((name for name in names if name in specials), None)
            if found is not None:
                special[role] = found
    vocab_size = max(token_ids.values()) + 1 if token_ids else 0
    return TokenizerInfo(tokenizer_json, companions, vocab_size, token_ids, special)


def write_tokenizer_files(
    info: TokenizerInfo, folder: Path, *, special_ids: dict[str, Any], model_max_length: int
) -> None:
    """Copy the tokenizer files into ``folder``; write a ``tokenizer_config.json`` if none came along.

    Args:
        info: the tokenizer.
        folder: the export folder.
        special_ids: ``{"bos": id, "eos": id, "pad": id}`` as exported in config.json (None: unknown; a list
            of EOS ids names the tokenizer's own EOS token when it is among them, else the first).
        model_max_length: the model's longest sequence (the tokenizer's truncation limit).
    """
    shutil.copyfile(info.tokenizer_json, folder / TOKENIZER_JSON)
    for companion in info.companions:
        shutil.copyfile(companion, folder / companion.name)
    if any(companion.name == TOKENIZER_CONFIG for companion in info.companions):
        return
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    for role, token_id in special_ids.items():
        ids = token_id if isinstance(token_id, list) else [] if token_id is None else [token_id]
        own = info.special.get(role)  # the tokenizer's own token, when it is one of the exported ids
        token = (
            own
            if own is not None and info.token_ids[own] in ids
            else next((t for t in map(info.token_of, ids) if t is not None), None)
        )
        if token is not None:
            config[f"{role}_token"] = token
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
