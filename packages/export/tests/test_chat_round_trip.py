"""Tokenizer side of import -> export: special tokens, every EOS id and the chat template survive.

A Llama-3-style folder (EOS list ``[<|end_of_text|>, <|eot_id|>]``, a chat template in the tokenizer
files) is imported and exported with its own tokenizer; `transformers` then renders the same chat to the
same ids, and its ``generate`` and Halyard's stop at the same EOS.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from halyard.export import export_hf, import_hf

WORDS = [
    "<unk>",
    "user",
    "assistant",
    "system",
    "hello",
    "how",
    "are",
    "you",
    "fine",
    "thanks",
    "be",
    "brief",
]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|> "
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}"
)
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello how are you"},
    {"role": "assistant", "content": "fine thanks"},
]
VOCAB = len(WORDS) + len(SPECIALS)
END_OF_TEXT, EOT = WORDS.__len__() + 1, WORDS.__len__() + 2


def _tokenizer_folder(folder: Path) -> transformers.PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(SPECIALS)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=SPECIALS[0], eos_token="<|eot_id|>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def _llama_folder(folder: Path, eos: list[int]) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5, bos_token_id=len(WORDS),
        eos_token_id=eos, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def _render(tokenizer: transformers.PreTrainedTokenizerBase) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(rendered["input_ids"])


def _greedy(model: transformers.PreTrainedModel, ids: list[int], eos: list[int] | None) -> list[int]:
    with torch.no_grad():
        stops = {} if eos is None else {"eos_token_id": eos}  # None: the folder's generation_config.json
        out = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=0, **stops)
    return out[0, len(ids) :].tolist()


def test_import_export_keeps_eos_ids_special_tokens_and_chat_template(tmp_path: Path) -> None:
    source = tmp_path / "source"
    tokenizer = _tokenizer_folder(source)
    chat_ids = _render(tokenizer)
    assert chat_ids[0] == len(WORDS) and EOT in chat_ids  # the template really rendered special tokens
    # a stop token that the random model really emits: its third greedy token joins <|end_of_text|>
    free = _greedy(_llama_folder(tmp_path / "probe", [END_OF_TEXT]), chat_ids, eos=[-1])
    stop = free[2]
    eos = [END_OF_TEXT, stop] if stop != END_OF_TEXT else [END_OF_TEXT]
    original = _llama_folder(source, eos)

    config, model = import_hf(source)
    assert config.eos_token_ids == tuple(eos)
    export_hf(model, tmp_path / "out", tokenizer=source)

    out = tmp_path / "out"
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eos
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    reloaded_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert reloaded_tokenizer.chat_template == CHAT_TEMPLATE
    assert (reloaded_tokenizer.bos_token, reloaded_tokenizer.eos_token) == (SPECIALS[0], "<|eot_id|>")
    assert _render(reloaded_tokenizer) == chat_ids

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert reloaded.generation_config.eos_token_id == eos
    with torch.no_grad():
        expected = original(torch.tensor([chat_ids])).logits.numpy()
        actual = reloaded(torch.tensor([chat_ids])).logits.numpy()
    np.testing.assert_array_equal(actual, expected)  # the same transformers model on the same tensors

    # transformers stops at the exported EOS list (Halyard's engine stops at config.eos_token_ids, the
    # imported list asserted above: halyard-serve's tests)
    theirs = _greedy(reloaded, chat_ids, eos=None)
    assert theirs == free[:3]
