"""``halyard generate`` and ``halyard eval``: use a finished (or running) run's latest checkpoint."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from halyard.train.config import ConfigError, parse_config
from halyard.train.run_config import TrainConfig

LORA_EXPORTS = ("merge", "adapter", "base")
"""What ``halyard export --lora`` writes of a LoRA run."""


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The resolved config a run saved in ``run_dir/config.yaml``.

    Raises:
        ConfigError: the run folder has no config.yaml.
    """
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{path} does not exist: --run must name a training run folder (trainer.run_dir)")
    return parse_config(TrainConfig, [], path)


def generate_main(argv: Sequence[str]) -> int:
    """Continue a prompt with the latest checkpoint of a run."""
    parser = argparse.ArgumentParser(prog="halyard generate", description=generate_main.__doc__)
    parser.add_argument("--run", required=True, help="the run folder (trainer.run_dir)")
    parser.add_argument(
        "--prompt", action="append", required=True, help="text to continue (repeat for a batch)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from halyard.models.sampling import SamplingConfig, generate
    from halyard.train.trainer.data import load_run_tokenizer, tokenizer_path_of
    from halyard.train.trainer.trainer import Trainer

    config = load_run_config(args.run)
    tokenizer = load_run_tokenizer(tokenizer_path_of(config.data, Path(args.run), init=config.trainer.init))
    state = Trainer(config).restore_state(args.step)
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p
    )
    prompts = [tokenizer.encode(p).ids or [0] for p in args.prompt]
    result = generate(jax.device_get(state.params), prompts, sampling, key=jax.random.key(args.seed))
    for prompt, row, length in zip(args.prompt, np.asarray(result.tokens), np.asarray(result.lengths)):
        print(prompt + tokenizer.decode(row[:length].tolist()))  # stop tokens end a row; padding follows
    return 0


def eval_main(argv: Sequence[str]) -> int:
    """Validation loss, perplexity and bits per byte of a run's checkpoint."""
    parser = argparse.ArgumentParser(prog="halyard eval", description=eval_main.__doc__)
    parser.add_argument("--run", required=True, help="the run folder (trainer.run_dir)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    args = parser.parse_args(argv)

    from halyard.train.mixture.config import mixture_sources
    from halyard.train.trainer.data import prepare_data
    from halyard.train.trainer.evaluate import Evaluator
    from halyard.train.trainer.trainer import Trainer

    config = load_run_config(args.run)
    sources = mixture_sources(config.data).values() or [config.data]  # a mixture: any source's split
    if max(source.validation_fraction for source in sources) <= 0:
        raise ConfigError("the run has no validation split (data.validation_fraction is 0)")
    trainer = Trainer(config)
    data = prepare_data(config.data, Path(args.run), progress=False, init=config.trainer.init)
    state = trainer.restore_state(args.step)
    assert data.validation is not None
    evaluator = Evaluator(data.validation, config, trainer.mesh, trainer.layout, data.tokenizer_path)
    metrics, _ = evaluator.evaluate(state.params)
    metrics["step"] = int(state.step)
    print(json.dumps(metrics))
    return 0


def export_main(argv: Sequence[str]) -> int:
    """Write a Hugging Face folder (config, safetensors, tokenizer) from a run's checkpoint."""
    parser = argparse.ArgumentParser(prog="halyard export", description=export_main.__doc__)
    parser.add_argument("--run", required=True, help="the run folder (trainer.run_dir)")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    parser.add_argument("--max-shard-bytes", type=int, default=None, help="split safetensors above this size")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument(
        "--lora",
        choices=LORA_EXPORTS,
        default="merge",
        help="a LoRA run: merge (the model with the adapters merged into its weights, the default), "
        "adapter (a PEFT adapter folder for the base) or base (the frozen base alone)",
    )
    args = parser.parse_args(argv)

    from halyard.export import DEFAULT_MAX_SHARD_BYTES, export_hf, export_peft_adapter
    from halyard.models.lora import merge_lora, without_lora
    from halyard.train.trainer.data import tokenizer_path_of
    from halyard.train.trainer.trainer import Trainer

    config = load_run_config(args.run)
    if args.lora != "merge" and not config.lora.enabled:
        raise ConfigError(
            f"--lora {args.lora}: {args.run} trained no adapters (lora.rank is 0); leave --lora out"
        )
    state = Trainer(config).restore_state(args.step)
    if args.lora == "adapter":
        init = config.trainer.init
        base = str(Path(init.removeprefix("hf:")).resolve()) if init.startswith("hf:") else None
        folder = export_peft_adapter(
            state.params, args.out, base_model=base, dtype=args.dtype, overwrite=args.overwrite
        )
        print(f"wrote the adapters of step {int(state.step)} of {args.run} to {folder} (PEFT)")
        return 0
    tokenizer = tokenizer_path_of(config.data, Path(args.run), init=config.trainer.init)
    folder = export_hf(
        merge_lora(state.params) if args.lora == "merge" else without_lora(state.params),
        args.out,
        tokenizer=tokenizer if Path(tokenizer).exists() else None,
        dtype=args.dtype,
        max_shard_bytes=args.max_shard_bytes or DEFAULT_MAX_SHARD_BYTES,
        overwrite=args.overwrite,
    )
    print(f"wrote {folder} from step {int(state.step)} of {args.run}")
    return 0
