"""`ServedModel`: a model with its tokenizer, its end-of-sequence ids and the name clients ask for; from a
Hugging Face folder (`load_hf_folder`) or from a model in memory and its tokenizer's files (`served_model`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from halyard.data import TokenizerSpec, load_tokenizer
from halyard.export import import_hf
from halyard.models import CausalLM
from halyard.serve.requests import eos_ids_of
from halyard.serve.server.tokenizer import TextTokenizer


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What a server serves.

    Attributes:
        name: what ``/v1/models`` lists and requests' ``model`` must say.
        model: the model (on one device, or placed for the engine's mesh).
        tokenizer: its tokenizer and chat template.
        eos_token_ids: ids that end a sample: the model config's (config.json and generation_config.json of
            a Hugging Face folder) and the tokenizer's EOS.
    """

    name: str
    model: CausalLM
    tokenizer: TextTokenizer
    eos_token_ids: tuple[int, ...]


def served_model(
    model: CausalLM,
    tokenizer: str | Path | TokenizerSpec,
    name: str,
    *,
    chat_template: str | None = None,
) -> ServedModel:
    """``model`` served under ``name``.

    Args:
        model: the model.
        tokenizer: a tokenizer folder (tokenizer.json, tokenizer_config.json with the chat template...), a
            tokenizer.json, or a loaded `halyard.data.TokenizerSpec`.
        name: the served name.
        chat_template: Jinja text replacing the tokenizer's chat template (None: the tokenizer's).

    Raises:
        TokenizerNotFoundError, TokenizerLoadError: no tokenizer there.
    """
    spec = tokenizer if isinstance(tokenizer, TokenizerSpec) else load_tokenizer(str(tokenizer))
    text = TextTokenizer(spec, chat_template)
    return ServedModel(name, model, text, eos_ids_of(model.model_config, text.token_id(spec.eos_token)))


def load_hf_folder(
    folder: str | Path, *, name: str | None = None, chat_template: str | None = None
) -> ServedModel:
    """A Hugging Face folder's model (halyard.export's importer), tokenizer and chat template.

    Args:
        folder: holds config.json, the safetensors weights and the tokenizer files.
        name: the served name (default: the folder's name).
        chat_template: Jinja text replacing the tokenizer's chat template.

    Raises:
        HfConversionError: a missing config.json or weights, or an unsupported architecture.
        TokenizerNotFoundError: the folder has no tokenizer.json.
    """
    folder = Path(folder)
    _, model = import_hf(folder)
    return served_model(model, folder, name or folder.resolve().name, chat_template=chat_template)
