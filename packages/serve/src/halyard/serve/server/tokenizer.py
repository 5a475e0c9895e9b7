"""`TextTokenizer`: a model's tokenizer as the server uses it (text <-> ids, each token's text, the chat
template), read with halyard.data's one tokenizer loader and rendered with its one template renderer."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from halyard.data import ExampleError, TokenizerSpec
from halyard.data.examples import render_prompt_with_template
from halyard.serve.server.errors import APIError


class TextTokenizer:
    """Encoding, decoding and chat rendering for one model.

    Args:
        spec: the tokenizer (`halyard.data.load_tokenizer` of a folder or a tokenizer.json).
        chat_template: a Jinja chat template that replaces the tokenizer's own (None: the tokenizer's).
    """

    def __init__(self, spec: TokenizerSpec, chat_template: str | None = None):
        self.spec = spec
        self.chat_template = chat_template if chat_template is not None else spec.chat_template
        self._tokenizer = spec.build()

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer knows (added tokens included)."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, special_tokens: bool) -> list[int]:
        """``text`` as token ids; ``special_tokens`` adds what the tokenizer's post-processor adds (a BOS)."""
        return list(self._tokenizer.encode(text, add_special_tokens=special_tokens).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Token ids as text, special tokens left out (the engine's ``decode``)."""
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (one tokenizer per server: the cache lives as long)
    def token_text(self, token_id: int) -> str:
        """One token's text as log-prob entries show it (special tokens spelt out)."""
        return str(self._tokenizer.decode([token_id], skip_special_tokens=False))

    def token_id(self, token: str | None) -> int | None:
        """The id of a token's text, None when unknown (or ``token`` is None)."""
        found = None if token is None else self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def serialized(self) -> str:
        """The tokenizer as ``tokenizer.json`` holds it (the grammar library reads the vocabulary from it)."""
        return str(self._tokenizer.to_str())

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """``messages`` rendered by the chat template with the generation prompt (the assistant's turn
        opened), as transformers' ``apply_chat_template(..., tools=tools, add_generation_prompt=True)``
        renders them.

        Raises:
            APIError: the model has no chat template, or the template refused the messages (param
                ``messages``).
        """
        if self.chat_template is None:
            raise APIError(
                "messages: this model's tokenizer has no chat template; use /v1/completions, or start the "
                "server with --chat-template FILE",
                "messages",
            )
        try:
            return render_prompt_with_template(
                self.chat_template,
                messages,
                "messages",
                bos_token=self.spec.bos_token or "",
                eos_token=self.spec.eos_token or "",
                tools=tools,
            )
        except ExampleError as error:
            raise APIError(str(error), "messages") from None
