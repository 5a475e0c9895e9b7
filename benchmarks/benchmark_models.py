"""The models `train_step.py` benchmarks (``--model``), each with its plain-JAX and PyTorch versions.

| name | model | why |
|---|---|---|
| ``gpt2`` | 6 layers, hidden 512, 8 heads, seq 256, batch 8, vocab 8192, tied (23.2M) | the reference shape |
| ``llama`` | 6 layers, hidden 512, MLP 1536, GQA 8/4, seq 256, batch 8, vocab 8192, untied | RMSNorm, RoPE, SwiGLU, GQA |
| ``llama-49k`` | 4 layers, hidden 256, MLP 768, GQA 4/2, seq 128, batch 16, vocab 49152, untied | the unembedding and the loss dominate (79% of the model FLOPs) |

Used by `benchmarks/training/train_step.py`; not a library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import gpt2_baselines
import llama_baselines
from gpt2_baselines import Gpt2Shapes
from llama_baselines import LlamaShapes

from halyard.models import ModelConfig, model_config


@dataclass(frozen=True)
class BenchmarkModel:
    """A benchmark shape: its full and quick sizes, the Halyard config, and the two baselines."""

    name: str
    shapes: Any
    quick_shapes: Any
    halyard_config: Callable[..., ModelConfig]
    make_plain_step: Callable[..., Any]
    plain_loss: Callable[[Any, Any, Any], Any]
    """``plain_loss(params, tokens, shapes)``: the plain-JAX loss (for profiles)."""
    make_torch_step: Callable[..., Any]
    description: str


def gpt2_config(shapes: Gpt2Shapes, **overrides: Any) -> ModelConfig:
    """The ``gpt2`` config of a GPT-2 benchmark shape (positions = seq_len, as in the baselines)."""
    return model_config(
        "gpt2",
        vocab_size=shapes.vocab_size,
        hidden_size=shapes.hidden_size,
        num_layers=shapes.num_layers,
        num_heads=shapes.num_heads,
        max_position=shapes.seq_len,
        **overrides,
    )


def llama_config(shapes: LlamaShapes, **overrides: Any) -> ModelConfig:
    """The ``llama`` config of a Llama benchmark shape (untied embeddings, theta 10000, as the baselines)."""
    return model_config(
        "llama",
        vocab_size=shapes.vocab_size,
        hidden_size=shapes.hidden_size,
        intermediate_size=shapes.intermediate_size,
        num_layers=shapes.num_layers,
        num_heads=shapes.num_heads,
        num_kv_heads=shapes.num_kv_heads,
        max_position=shapes.seq_len,
        rms_norm_eps=llama_baselines.RMS_NORM_EPS,
        initializer_range=llama_baselines.INIT_STD,
        tie_embeddings=False,
        **overrides,
    )


QUICK_LLAMA = LlamaShapes(
    num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, seq_len=32, batch_size=2,
    vocab_size=256,
)  # fmt: skip

MODELS: dict[str, BenchmarkModel] = {
    "gpt2": BenchmarkModel(
        "gpt2",
        Gpt2Shapes(),
        Gpt2Shapes(num_layers=2, hidden_size=64, num_heads=4, seq_len=32, batch_size=2, vocab_size=256),
        gpt2_config,
        gpt2_baselines.make_plain_step,
        lambda params, tokens, shapes: gpt2_baselines.plain_loss(params, tokens, shapes.num_heads),
        gpt2_baselines.make_torch_step,
        "GPT-2: 6 layers, hidden 512, 8 heads, seq 256, batch 8, vocab 8192, tied embeddings",
    ),
    "llama": BenchmarkModel(
        "llama",
        LlamaShapes(),
        QUICK_LLAMA,
        llama_config,
        llama_baselines.make_plain_step,
        llama_baselines.plain_loss,
        llama_baselines.make_torch_step,
        "Llama: 6 layers, hidden 512, MLP 1536, GQA 8/4, seq 256, batch 8, vocab 8192, untied",
    ),
    "llama-49k": BenchmarkModel(
        "llama-49k",
        LlamaShapes(
            num_layers=4, hidden_size=256, intermediate_size=768, num_heads=4, num_kv_heads=2, seq_len=128,
            batch_size=16, vocab_size=49152,
        ),
        replace(QUICK_LLAMA, vocab_size=4096, seq_len=16, batch_size=4),
        llama_config,
        llama_baselines.make_plain_step,
        llama_baselines.plain_loss,
        llama_baselines.make_torch_step,
        "Llama, large vocabulary: 4 layers, hidden 256, MLP 768, GQA 4/2, seq 128, batch 16, vocab 49152",
    ),
}  # fmt: skip
