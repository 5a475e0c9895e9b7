"""`PromptSet`: the prompts of a reinforcement-learning run (``data.format: prompts``) and their order.

A record holds a prompt (``data.prompt_field``: a string, or a list of chat messages) and the reference
answer the rewards compare with (``data.answer_field``), in any source Halyard reads (jsonl, json, parquet,
arrow, a ``datasets`` folder; local or fsspec URLs with globs). A list of messages is rendered with the chat
template (the tokenizer's own with ``data.chat_template: tokenizer``, else the simple role markers) and the
generation prompt; a string is the prompt as it is, or one user message with ``data.chat_template:
tokenizer``. Every record is checked when the run starts: an empty prompt, a missing field or an answer that
is not a string stop the run with one line naming the file, the line and the fix.

The order is a pure function of ``(data.seed, position)``: the records in a fresh permutation per pass over
them (an epoch), so rollout ``r`` of ``n`` prompts reads positions ``r * n ... r * n + n - 1`` and a resumed
run needs no saved iterator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from halyard.data import DataInputError, TokenizerSpec
from halyard.data.examples import render_prompt_with_template
from halyard.data.examples.messages import checked_messages
from halyard.data.sources import resolve_shards
from halyard.data.sources.rows import read_rows
from halyard.train.config.errors import ConfigError
from halyard.train.run_config import DataConfig
from halyard.train.user_errors import one_line


@dataclass(frozen=True)
class Prompt:
    """One record: the text the model continues, its tokens, the reference answer and where it came from."""

    text: str
    tokens: tuple[int, ...]
    answer: str
    where: str


class PromptSet:
    """Every prompt record of the run, tokenized, and their order.

    Args:
        prompts: the records in source order.
        seed: chooses each epoch's permutation.
    """

    def __init__(self, prompts: list[Prompt], seed: int):
        if not prompts:
            raise ConfigError("data.sources hold no prompt record: nothing to sample from")
        self.prompts = prompts
        self.seed = seed
        self._epochs: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def load(cls, config: DataConfig, tokenizer: TokenizerSpec, *, max_prompt_tokens: int) -> PromptSet:
        """Read, check and tokenize every record of ``data.sources``.

        Args:
            config: the ``data:`` section (``format: prompts``).
            tokenizer: the run's tokenizer (its chat template with ``chat_template: tokenizer``).
            max_prompt_tokens: the longest prompt that leaves room for the completion.

        Raises:
            ConfigError: one line naming file:line: a missing field, an empty prompt, an answer that is not a
                string, a prompt too long, messages that are not messages; or no record at all.
        """
        try:
            return cls(_load(config, tokenizer, max_prompt_tokens), config.seed)
        except DataInputError as error:
            raise ConfigError(one_line(str(error))) from None

    def at(self, position: int) -> tuple[int, Prompt]:
        """The record at ``position`` of the order (any position: epochs repeat with new permutations);
        returns ``(its index in source order, the prompt)``."""
        epoch, offset = divmod(position, len(self.prompts))
        order = self._epochs.get(epoch)
        if order is None:
            order = self._epochs[epoch] = np.random.default_rng([self.seed, epoch]).permutation(
                len(self.prompts)
            )
            if len(self._epochs) > 4:
                del self._epochs[min(self._epochs)]
        index = int(order[offset])
        return index, self.prompts[index]

    def batch(self, start: int, count: int) -> list[tuple[int, Prompt]]:
        """The prompts at positions ``start ... start + count - 1``."""
        return [self.at(position) for position in range(start, start + count)]


def _load(config: DataConfig, tokenizer: TokenizerSpec, max_prompt_tokens: int) -> list[Prompt]:
    built = tokenizer.build()
    prompts = []
    for shard in resolve_shards(list(config.sources)):
        for row in read_rows(shard):
            text = _prompt_text(row.value, row.where, config, tokenizer)
            tokens = tuple(built.encode(text, add_special_tokens=False).ids)
            if not tokens:
                raise ConfigError(f"{row.where}: the prompt {text!r} has no tokens; give it some text")
            if len(tokens) > max_prompt_tokens:
                raise ConfigError(
                    f"{row.where}: the prompt has {len(tokens)} tokens, more than the {max_prompt_tokens} the "
                    "context leaves beside rl.max_new_tokens; shorten it, or raise model.max_position"
                )
            answer = _field(row.value, config.answer_field, row.where, "data.answer_field")
            if not isinstance(answer, str | int | float) or isinstance(answer, bool):
                raise ConfigError(
                    f"{row.where}: the answer ({config.answer_field!r}) must be a string or a number"
                )
            prompts.append(Prompt(text, tokens, str(answer), row.where))
    return prompts


def _field(value: dict[str, Any], key: str, where: str, option: str) -> Any:
    if key not in value:
        raise ConfigError(
            f"{where}: no {key!r} field (keys: {sorted(value)}); set {option} to the key that holds it"
        )
    return value[key]


def _prompt_text(value: dict[str, Any], where: str, config: DataConfig, tokenizer: TokenizerSpec) -> str:
    raw = _field(value, config.prompt_field, where, "data.prompt_field")
    if isinstance(raw, str):
        if not raw.strip():
            raise ConfigError(
                f"{where}: the prompt ({config.prompt_field!r}) is empty; give the question there"
            )
        if config.chat_template != "tokenizer":
            return raw
        messages = [{"role": "user", "content": raw}]
    else:
        try:
            messages = checked_messages(
                raw, where, config.prompt_field, config.role_field, config.content_field
            )
        except (ValueError, KeyError) as error:
            raise ConfigError(str(error).strip("'\"")) from None
    template = tokenizer.chat_template if config.chat_template in ("tokenizer", "auto") else None
    if template is not None:
        return render_prompt_with_template(
            template, messages, where, tokenizer.bos_token or "", tokenizer.eos_token or ""
        )
    if config.chat_template == "tokenizer":
        raise ConfigError(
            f"data.chat_template=tokenizer but the tokenizer {tokenizer.source} has no chat template"
        )
    markers = {
        "system": config.system_marker,
        "user": config.user_marker,
        "assistant": config.assistant_marker,
    }
    return (
        "".join(markers[m["role"]] + m["content"] + config.end_of_turn for m in messages)
        + config.assistant_marker
    )
