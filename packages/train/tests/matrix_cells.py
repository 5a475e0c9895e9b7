"""The cells of the Trainer matrix: one tiny run config per combination, written as `train` arguments.

Each cell is one row of a covering design: every optimizer with and without clipping, every schedule,
every registered model family, every layout, accumulation, bf16 compute and z-loss each appear in at least
one row (`test_matrix_covers_every_option` checks it), so the matrix costs one training per row, not a product.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

STEPS = 6
"""Steps of a cell's run."""
CHECKPOINT_EVERY = 4
"""A checkpoint at step 4 (and one at the end): the resume starts from step 4 with the same program."""

BASE: dict[str, Any] = {
    "data": {
        "builtin_corpus": "python-stdlib",
        "max_documents": 20,
        "tokenizer_vocab_size": 384,
        "seq_len": 16,
        "num_workers": 0,
    },
    "trainer": {
        "steps": STEPS,
        "batch_size": 8,
        "log_every": 1,
        "progress": False,
        "min_shard": 1,
        "plot": False,
    },
    "checkpoint": {"every_steps": CHECKPOINT_EVERY, "every_seconds": None, "keep_last": 2},
    "trackers": [{"type": "jsonl"}],
}

SHAPE = {"vocab_size": 384, "hidden_size": 32, "num_layers": 2, "max_position": 32}
ROTARY_SHAPE = {**SHAPE, "intermediate_size": 64, "num_heads": 2, "num_kv_heads": 2}
MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {**SHAPE, "num_heads": 2},
    "llama": ROTARY_SHAPE,
    "mistral": {**ROTARY_SHAPE, "sliding_window": 8},
    "qwen2": ROTARY_SHAPE,
    "mixtral": {**ROTARY_SHAPE, "num_experts": 4, "num_experts_per_token": 2},
    "qwen3": {**ROTARY_SHAPE, "head_dim": 8},  # heads narrower than hidden_size / num_heads
    "olmo2": ROTARY_SHAPE,
    "gemma": {**ROTARY_SHAPE, "num_kv_heads": 1, "head_dim": 16},  # one KV head (MQA)
    "gemma2": {**ROTARY_SHAPE, "head_dim": 16, "sliding_window": 8},  # a local and a global layer
    "gemma3": {**ROTARY_SHAPE, "head_dim": 16, "sliding_window": 8, "sliding_window_pattern": 2},
    "phi3": {  # longrope past position 8 (of 16), half of each head rotating, a window
        **ROTARY_SHAPE,
        "sliding_window": 8,
        "rope": {
            "scaling": "longrope",
            "short_factor": [1.0, 1.2, 1.5, 2.0],
            "long_factor": [1.5, 2.0, 4.0, 8.0],
            "original_max_position": 8,
            "partial_rotary_factor": 0.5,
        },
    },
    "mup": {
        "vocab_size": 384,
        "hidden_size": 32,
        "d_base": 32,
        "head_dim": 16,
        "num_layers": 2,
        "max_position": 32,
    },
}
MESHES: dict[str, dict[str, int]] = {
    "data_parallel": {"data": -1},
    "fsdp": {"data": 1, "fsdp": -1},
    "tensor_parallel": {"data": -1, "tensor": 2},
    "fsdp_tensor": {"data": 1, "fsdp": 4, "tensor": 2},
}
LEARNING_RATES = {"adamw": 0.01, "lion": 0.002, "sophia_h": 0.01, "muon": 0.02}
SCHEDULES = {
    "constant": {"type": "constant", "warmup": 1},
    "cosine": {"type": "cosine", "warmup": 1},
    "linear": {"type": "linear", "warmup": 1},
    "wsd": {"type": "wsd", "warmup": 1, "decay": 0.5},
}


@dataclass(frozen=True)
class Cell:
    """One row of the matrix."""

    optimizer: str
    clip: bool
    schedule: str
    model: str
    layout: str
    trainer: dict[str, Any] = field(default_factory=dict)
    trackers: tuple[str, ...] = ("jsonl",)
    compute_dtype: str | None = None
    """The model's compute dtype (None: its float32 parameters' dtype)."""

    @property
    def name(self) -> str:
        extras = "-".join(f"{key}={value}" for key, value in self.trainer.items())
        clip = "clip" if self.clip else "noclip"
        trackers = "+".join(self.trackers) if self.trackers != ("jsonl",) else ""
        compute = f"compute={self.compute_dtype}" if self.compute_dtype else ""
        parts = [self.optimizer, clip, self.schedule, self.model, self.layout, extras, compute, trackers]
        return "-".join(filter(None, parts))

    def config(self, run_dir: Path, cache_dir: Path) -> dict[str, Any]:
        """The cell's run config as the nested dict a YAML file would hold."""
        values = yaml.safe_load(yaml.safe_dump(BASE))
        values["model"] = {"type": self.model, **MODELS[self.model]}
        if self.compute_dtype is not None:
            values["model"]["compute_dtype"] = self.compute_dtype
        values["optimizer"] = {
            "type": self.optimizer,
            "learning_rate": LEARNING_RATES[self.optimizer],
            "max_grad_norm": 1.0 if self.clip else None,
            "schedule": SCHEDULES[self.schedule],
        }
        values["trainer"].update(
            run_dir=str(run_dir), layout=self.layout, mesh=MESHES[self.layout], **self.trainer
        )
        values["data"]["cache_dir"] = str(cache_dir)
        values["trackers"] = [{"type": tracker} for tracker in self.trackers]
        return values


# One row a model family (each row costs a training): the 12 families carry every other option. Sophia-H with
# clipping rides on OLMo 2 (Lion with clipping on Mistral), accumulation on Sophia-H (data parallel) and on
# AdamW with bf16 compute (fsdp x tensor), as two rows did on Llama and one on GPT-2 before.
CELLS = [
    Cell("adamw", True, "cosine", "llama", "data_parallel", trackers=("jsonl", "tensorboard", "wandb")),
    Cell("adamw", False, "constant", "gpt2", "fsdp"),
    Cell("lion", True, "linear", "mistral", "tensor_parallel"),
    Cell("lion", False, "wsd", "qwen2", "fsdp_tensor"),
    Cell("muon", True, "constant", "mup", "data_parallel", compute_dtype="bfloat16"),
    Cell("muon", False, "linear", "mixtral", "fsdp", {"z_loss_weight": 0.001}),
    Cell("adamw", False, "cosine", "qwen3", "tensor_parallel"),
    Cell("sophia_h", True, "constant", "olmo2", "fsdp"),
    Cell("sophia_h", False, "constant", "gemma", "data_parallel", {"accumulation": 2}),
    Cell("muon", True, "wsd", "gemma2", "fsdp"),
    Cell("adamw", True, "linear", "gemma3", "fsdp_tensor", {"accumulation": 2}, compute_dtype="bfloat16"),
    Cell("lion", False, "cosine", "phi3", "tensor_parallel"),
]


def write_cell_config(path: Path, values: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def run_train(argv: list[str]) -> int:
    """``train ARGV`` in this process (`train_main`, what the command runs); its exit status."""
    from halyard.train.cli import train_main

    try:
        return train_main(argv)
    except SystemExit as exit:  # the command's error paths exit with a status
        return int(exit.code or 0)
