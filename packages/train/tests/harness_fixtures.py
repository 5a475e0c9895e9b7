"""A tiny Llama exported to a Hugging Face folder with its tokenizer, and a local multiple-choice task,
for the lm-evaluation-harness tests."""

from __future__ import annotations

import json
from pathlib import Path

import jax

from halyard.export import export_hf
from halyard.models import LlamaConfig
from halyard.train.corpora.tokenizer import train_bpe_tokenizer

TASK = "halyard_tiny_choice"
CORPUS = [
    "The cat sat on the mat. The dog ran to the park.",
    "Paris is the capital of France. Rome is the capital of Italy.",
    "Two plus two is four. Three plus three is six.",
    "Water boils at one hundred degrees. Ice melts when it is warm.",
]
EXAMPLES = [
    {"question": "The cat sat on the", "choices": ["mat", "sky", "river"], "answer": 0},
    {"question": "Paris is the capital of ", "choices": ["Italy", "France"], "answer": 1},
    {"question": "Two plus two is", "choices": [" four", " six", " ten"], "answer": 0},
    {"question": "Water boils at one hundred", "choices": ["degrees", "cats"], "answer": 0},
    {"question": "Rome is the capital of", "choices": ["France", "Italy", "the park"], "answer": 1},
    {"question": "The dog ran to the", "choices": ["park", "mat"], "answer": 0},
]


def write_tokenizer(folder: Path) -> Path:
    """A byte-level BPE of 320 ids trained on `CORPUS` (``<|endoftext|>`` is id 0 and the EOS)."""
    folder.mkdir(parents=True, exist_ok=True)
    shard = folder / "corpus.jsonl"
    shard.write_text("".join(json.dumps({"text": text}) + "\n" for text in CORPUS * 4))
    return train_bpe_tokenizer([shard], folder / "tokenizer.json", vocab_size=320)


def tiny_llama_config(vocab_size: int) -> LlamaConfig:
    """Two layers of width 32 with weights large enough (std 0.3) that choices differ clearly in log-likelihood."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position=64,
        initializer_range=0.3,
    )


def write_hf_llama(folder: Path, tokenizer: Path) -> Path:
    """The tiny Llama (seed 0; 8 rows of vocabulary padding past the tokenizer's 320) exported with ``tokenizer``."""
    model = tiny_llama_config(328).init(jax.random.key(0))
    return export_hf(model, folder, tokenizer=tokenizer)


def write_task(folder: Path, cache: Path) -> Path:
    """A task folder: `TASK`'s YAML reading `EXAMPLES` from a jsonl file beside it (datasets cache in ``cache``)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "tiny_choice.jsonl"
    data.write_text("".join(json.dumps(example) + "\n" for example in EXAMPLES))
    (folder / f"{TASK}.yaml").write_text(
        "\n".join(
            [
                f"task: {TASK}",
                "dataset_path: json",
                "dataset_kwargs:",
                "  data_files:",
                f"    test: {data}",
                f"  cache_dir: {cache}",
                "test_split: test",
                "output_type: multiple_choice",
                'doc_to_text: "{{question}}"',
                'doc_to_choice: "{{choices}}"',
                'doc_to_target: "{{answer}}"',
                "metric_list:",
                "  - metric: acc",
                "    aggregation: mean",
                "    higher_is_better: true",
                "",
            ]
        )
    )
    return folder
