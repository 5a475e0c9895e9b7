"""The engine against transformers' ``generate`` on the same weights: a Hugging Face folder written by
transformers, imported with `halyard.export.import_hf` (the path of ``halyard serve --hf``), continued
greedily by both. Tokens are equal token for token; the engine's log-probs equal the log-softmax of the
logits transformers generated each token from (float32 tolerance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from float_tolerance import decoder_terms, summation_tolerance

from halyard.export import import_hf
from halyard.serve import Engine, EngineConfig, SamplingParams

VOCAB = 97
NEW_TOKENS = 12
PROMPTS = [
    [5, 9, 2, 7, 1, 33, 60, 12, 4, 4, 81],
    [3, 17],
    [8, 8, 4, 60, 2, 2, 2, 2, 2, 11, 90, 1, 5, 6, 7, 70, 71, 72],
]
COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2)  # fmt: skip
FAMILIES: dict[str, tuple[Any, dict[str, Any]]] = {
    "llama": (transformers.LlamaConfig, dict(num_hidden_layers=2)),
    "qwen3": (transformers.Qwen3Config, dict(num_hidden_layers=2, head_dim=16)),
    "mixtral": (
        transformers.MixtralConfig,
        dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
    ),
    # local, local, global, local: windows of 4 shorter than the prompts, soft-capped logits off (Gemma 3)
    "gemma3": (
        transformers.Gemma3TextConfig,
        dict(
            num_hidden_layers=4,
            head_dim=16,
            sliding_window=4,
            sliding_window_pattern=3,
            query_pre_attn_scalar=12,
            rope_theta=1000000.0,
            rope_local_base_freq=100.0,
        ),
    ),
}


CONFIG = EngineConfig(
    page_size=8, num_pages=32, max_context=32, max_running=4, chunk_size=16, max_prefill_rows=2, min_rows=36
)
"""Every step in a program of the most tokens a step holds (4 + 2 x 16), reading at most 4 pages (the longest
prompt and its new tokens: 30): a family compiles one program per page bucket, not one per token bucket too."""


def _hf_folder(family: str, folder: Path) -> Any:
    config_class, arguments = FAMILIES[family]
    config = config_class(**COMMON, **arguments)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval().float()
    with torch.no_grad():  # norms away from one, so that a misplaced norm shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.3 * torch.randn_like(parameter))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generation_equals_transformers(family: str, tmp_path: Path) -> None:
    hf_model = _hf_folder(family, tmp_path)
    _, model = import_hf(tmp_path)
    engine = Engine(model, CONFIG)
    outputs = engine.generate(
        PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    )
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        with torch.no_grad():
            generated = hf_model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        tokens = generated.sequences[0, len(prompt) :].tolist()
        rows = [torch.log_softmax(step[0].float(), -1).numpy() for step in generated.logits]
        logprobs = [row[t] for row, t in zip(rows, tokens)]
        sample = output.samples[0]
        assert sample.token_ids == tokens, (family, prompt)
        # torch's kernels and XLA's add the same terms in other orders: the forward's reductions and the
        # log-softmax's sum over the vocabulary, scaled by the largest |log-prob| (at least the logits' spread)
        terms = decoder_terms(model.model_config, len(prompt) + NEW_TOKENS) + VOCAB
        atol = summation_tolerance(rows, terms)
        np.testing.assert_allclose(sample.logprobs, logprobs, atol=atol, rtol=0, err_msg=f"{family} {prompt}")
