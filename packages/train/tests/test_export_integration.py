"""Train a tiny Llama a few steps, export it with its tokenizer, and generate greedily in transformers:
the continuation equals Halyard's own sampler's."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer
from trainer_fixtures import load_config, write_config

from halyard.export import export_hf
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.train.data_assembly.tokenizer import tokenizer_path_of
from halyard.train.trainer.trainer import Trainer

PROMPTS = ["def main(", "import os\nimport sys\n\n"]
NEW_TOKENS = 12


def test_trained_model_exports_and_generates_the_same_greedy_text_in_transformers(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = load_config(
        write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", trainer={"steps": 4})
    )
    result = Trainer(config).fit()
    model = result.state.params
    tokenizer_path = tokenizer_path_of(config.data, tmp_path / "run")
    tokenizer = Tokenizer.from_file(tokenizer_path)
    eos = tokenizer.token_to_id("<|endoftext|>")

    out = export_hf(model, tmp_path / "hf", tokenizer=tokenizer_path)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eos

    prompts = [tokenizer.encode(text).ids for text in PROMPTS]
    context = max(map(len, prompts)) + NEW_TOKENS
    engine = Engine(model, EngineConfig.sized_for(sequences=len(prompts), context=context, page_size=16))
    ours = engine.generate(
        prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, stop_token_ids=(eos,))
    )
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    for row, text in enumerate(PROMPTS):
        input_ids = hf_tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        assert input_ids[0].tolist() == prompts[row]
        with torch.no_grad():
            generated = hf_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=eos,
                eos_token_id=eos,
            )
        theirs = generated[0, input_ids.shape[1] :].tolist()
        assert theirs == ours[row].samples[0].token_ids, f"prompt {text!r}"
        assert len(theirs) > 1
