"""Tokenizer files next to the export: AutoTokenizer loads them, config ids come from them, padding cut."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import transformers
from float_tolerance import summation_tolerance
from hf_cases import VOCAB, padded_batch, save, torch_logits
from tokenizers import Tokenizer, models, pre_tokenizers

from halyard.export import export_hf, import_hf, read_tokenizer

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]


def _tokenizer(path: Path, *, with_config: bool) -> Path:
    vocab = {"<|endoftext|>": 0, "<s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>", "<s>", "<pad>"])  # "<pad>" becomes id 11
    path.mkdir(parents=True)
    tokenizer.save(str(path / "tokenizer.json"))
    if with_config:
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<s>"}
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_export_with_a_bare_tokenizer_json(tmp_path: Path) -> None:
    original = save("llama_gqa_tied", tmp_path / "hf")
    tokenizer_json = _tokenizer(tmp_path / "tok", with_config=False) / "tokenizer.json"
    info = read_tokenizer(tokenizer_json)
    assert info.vocab_size == 12 and info.special == {"eos": "<|endoftext|>", "bos": "<s>", "pad": "<pad>"}
    _, model = import_hf(tmp_path / "hf")
    export_hf(model, tmp_path / "out", tokenizer=tokenizer_json)

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    # EOS: the imported checkpoint's own (2, kept in the model config's eos_token_ids); BOS, pad: the tokenizer's
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 11)
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 11)
    # the model's 97 rows are cut to the tokenizer's 12: ids beyond the tokenizer were padding
    assert config["vocab_size"] == 12

    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert isinstance(loaded, transformers.PreTrainedTokenizerFast)
    assert loaded("the cat sat", add_special_tokens=False)["input_ids"] == [3, 4, 5]
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) == ("<s>", "<unk>", "<pad>")  # eos: id 2
    # a model without EOS ids of its own (trained from scratch) takes the tokenizer's
    _, bare = import_hf(tmp_path / "hf", config_overrides={"eos_token_ids": ()})
    export_hf(bare, tmp_path / "bare", tokenizer=tokenizer_json)
    assert json.loads((tmp_path / "bare" / "config.json").read_text())["eos_token_id"] == 0

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    )
    ids, attention_mask = padded_batch()
    ids = ids % 12
    expected = torch_logits(original, ids, attention_mask)[..., :12]
    actual = torch_logits(reloaded.eval(), ids, attention_mask)
    valid = attention_mask.astype(bool)
    assert actual.shape[-1] == 12
    # the same transformers model on the same tensors but a 12-row vocabulary projection for 97: its dot
    # products (the width's addends) may be added in another order
    bound = summation_tolerance(expected[valid], original.config.hidden_size)
    np.testing.assert_allclose(actual[valid], expected[valid], atol=bound, rtol=0)


def test_export_with_a_tokenizer_folder_keeps_its_config_and_explicit_ids_win(tmp_path: Path) -> None:
    save("gpt2", tmp_path / "hf")
    folder = _tokenizer(tmp_path / "tok", with_config=True)
    _, model = import_hf(tmp_path / "hf")
    export_hf(model, tmp_path / "out", tokenizer=folder, vocab_size=VOCAB, pad_token_id=2)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 0, 2)
    assert config["vocab_size"] == VOCAB
    copied = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert copied["eos_token"] == "<s>"
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert loaded.eos_token == "<s>" and loaded("a dog ran", add_special_tokens=False)["input_ids"] == [
        8,
        9,
        10,
    ]
