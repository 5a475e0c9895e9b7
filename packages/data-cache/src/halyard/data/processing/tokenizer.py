"""Load a Hugging Face tokenizer from a tokenizer.json, a folder, or an object, with its identity."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import fsspec
from tokenizers import Tokenizer

from halyard.data.errors import TokenizerLoadError, TokenizerNotFoundError


@dataclass(frozen=True)
class TokenizerSpec:
    """A tokenizer in a picklable form: its serialized JSON plus the BOS/EOS names its config declares.

    Attributes:
        serialized: the ``tokenizer.json`` content (``Tokenizer.to_str()``).
        bos_token: the BOS token named by ``tokenizer_config.json`` or the tokenizer object, if any.
        eos_token: the EOS token named likewise, if any.
        source: where it came from (for messages only; not part of the identity).
        chat_template: the Jinja chat template named by ``tokenizer_config.json`` or the tokenizer object,
            if any (used by chat examples with ``chat_template="tokenizer"``).
    """

    serialized: str
    bos_token: str | None
    eos_token: str | None
    source: str
    chat_template: str | None = None

    @cached_property
    def sha256(self) -> str:
        """Content hash of the serialized tokenizer: the tokenizer's identity in cache metadata."""
        return hashlib.sha256(self.serialized.encode("utf-8")).hexdigest()

    def build(self) -> Tokenizer:
        """The ``tokenizers.Tokenizer`` (built once per process and tokenizer; building takes ~0.1-0.5 s)."""
        built = _BUILT_TOKENIZERS.get(self.sha256)
        if built is None:
            built = _BUILT_TOKENIZERS[self.sha256] = _without_truncation(Tokenizer.from_str(self.serialized))
        return built


# One built Tokenizer per process and content hash.
_BUILT_TOKENIZERS: dict[str, Tokenizer] = {}


def _without_truncation(tokenizer: Tokenizer) -> Tokenizer:
    # A tokenizer saved with truncation or padding would cut or pad documents; the cache needs neither.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _spec_from_tokenizer(
    tokenizer: Tokenizer,
    bos_token: str | None,
    eos_token: str | None,
    source: str,
    owned: bool = False,
    chat_template: str | None = None,
) -> TokenizerSpec:
    spec = TokenizerSpec(tokenizer.to_str(), bos_token, eos_token, source, chat_template)
    if owned:  # built here from a file: reuse it instead of parsing the JSON again
        _BUILT_TOKENIZERS.setdefault(spec.sha256, _without_truncation(tokenizer))
    return spec


def load_tokenizer(tokenizer: Any) -> TokenizerSpec:
    """Load a tokenizer for the processor.

    Args:
        tokenizer: a path or fsspec URL of a ``tokenizer.json``; a folder holding ``tokenizer.json`` (and
            optionally ``tokenizer_config.json`` / ``special_tokens_map.json`` naming BOS/EOS, and a chat
            template in ``tokenizer_config.json`` or ``chat_template.jinja``); a
            ``tokenizers.Tokenizer``; a ``transformers`` fast tokenizer object; or a ``TokenizerSpec``.

    Raises:
        TokenizerNotFoundError: the path does not exist or the folder has no ``tokenizer.json``.
        TokenizerLoadError: the file is not a tokenizer the ``tokenizers`` library can read.
        TypeError: an object that is not a fast tokenizer (names its type and what to pass instead).
    """
    if isinstance(tokenizer, TokenizerSpec):
        return tokenizer
    if isinstance(tokenizer, Tokenizer):
        return _spec_from_tokenizer(tokenizer, None, None, "tokenizers.Tokenizer object")
    if isinstance(tokenizer, str | os.PathLike):
        return _load_path(os.fspath(tokenizer))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return _spec_from_tokenizer(
            backend,
            _token_text(getattr(tokenizer, "bos_token", None)),
            _token_text(getattr(tokenizer, "eos_token", None)),
            f"{type(tokenizer).__name__} object",
            chat_template=_template_text(getattr(tokenizer, "chat_template", None)),
        )
    raise TypeError(
        f"cannot use a {type(tokenizer).__name__} as a tokenizer: pass a path to tokenizer.json, a tokenizer "
        "folder, a tokenizers.Tokenizer, or a transformers *fast* tokenizer (use_fast=True)"
    )


def _load_path(path: str) -> TokenizerSpec:
    fs, local = fsspec.core.url_to_fs(path)
    if not fs.exists(local):
        raise TokenizerNotFoundError(
            f"tokenizer {path!r} does not exist; pass a tokenizer.json or its folder"
        )
    if not fs.isdir(local):
        return _spec_from_tokenizer(_parse(_read_text(path), path), None, None, path, owned=True)
    folder = path.rstrip("/")
    if not fs.exists(local.rstrip("/") + "/tokenizer.json"):
        raise TokenizerNotFoundError(
            f"tokenizer folder {path!r} has no tokenizer.json; only fast (tokenizers-library) tokenizers are "
            "supported: save one with tokenizer.save_pretrained(folder) from a fast tokenizer"
        )
    bos_token = eos_token = chat_template = None
    for config_name in ("special_tokens_map.json", "tokenizer_config.json"):
        config_path = local.rstrip("/") + "/" + config_name
        if fs.exists(config_path):
            config = json.loads(_read_text(folder + "/" + config_name))
            bos_token = _token_text(config.get("bos_token")) or bos_token
            eos_token = _token_text(config.get("eos_token")) or eos_token
            chat_template = _template_text(config.get("chat_template")) or chat_template
    # transformers >= 4.43 saves the template to its own file (it then takes precedence over the config).
    if fs.exists(local.rstrip("/") + "/chat_template.jinja"):
        chat_template = _read_text(folder + "/chat_template.jinja")
    # Re-serialized, so a file saved pretty-printed and the same tokenizer in memory hash alike.
    return _spec_from_tokenizer(
        _parse(_read_text(folder + "/tokenizer.json"), folder + "/tokenizer.json"),
        bos_token,
        eos_token,
        path,
        owned=True,
        chat_template=chat_template,
    )


def _parse(serialized: str, path: str) -> Tokenizer:
    try:
        return Tokenizer.from_str(serialized)
    except Exception as error:  # the tokenizers library raises a bare Exception for malformed JSON
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TokenizerLoadError(
            f"{path} is not a tokenizer ({first_line}); pass a tokenizer.json saved by the tokenizers "
            "library or a folder holding one (tokenizer.save_pretrained(folder) of a fast tokenizer)"
        ) from None


def _read_text(url: str) -> str:
    with fsspec.open(url, "r", encoding="utf-8") as handle:
        return handle.read()


def _token_text(token: Any) -> str | None:
    if token is None:
        return None
    if isinstance(token, dict):
        return token.get("content")
    return str(token)


def _template_text(template: Any) -> str | None:
    # A template is a string, or (older configs) a list of named templates where "default" is the chat one.
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        for entry in template:
            if isinstance(entry, dict) and entry.get("name") == "default":
                return entry.get("template")
    return None
