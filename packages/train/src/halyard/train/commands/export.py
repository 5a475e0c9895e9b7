"""``halyard export``: a Hugging Face folder (or a PEFT adapter folder) from a run's checkpoint."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from halyard.export import DEFAULT_MAX_SHARD_BYTES, export_hf, export_peft_adapter
from halyard.models.lora import merge_lora, without_lora
from halyard.train.config.errors import ConfigError
from halyard.train.run.loading import load_run_config, load_run_model

LORA_EXPORTS = ("merge", "adapter", "base")
"""What ``halyard export --lora`` writes of a LoRA run."""
ADAPTER_CONFIG = "adapter_config.json"
"""The file that makes a folder a PEFT adapter (what `export_peft_adapter` refuses to write over)."""


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

    config = load_run_config(args.run)
    if args.lora != "merge" and not config.lora.enabled:
        raise ConfigError(
            f"--lora {args.lora}: {args.run} trained no adapters (lora.rank is 0); leave --lora out"
        )
    if not args.overwrite:
        _refuse_an_earlier_export(Path(args.out), adapter=args.lora == "adapter")
    loaded = load_run_model(args.run, args.step)
    if args.lora == "adapter":
        init = config.trainer.init
        base = str(Path(init.removeprefix("hf:")).resolve()) if init.startswith("hf:") else None
        folder = export_peft_adapter(
            loaded.model, args.out, base_model=base, dtype=args.dtype, overwrite=args.overwrite
        )
        print(f"wrote the adapters of step {loaded.step} of {args.run} to {folder} (PEFT)")
        return 0
    folder = export_hf(
        merge_lora(loaded.model) if args.lora == "merge" else without_lora(loaded.model),
        args.out,
        tokenizer=loaded.tokenizer if Path(loaded.tokenizer).exists() else None,
        dtype=args.dtype,
        max_shard_bytes=args.max_shard_bytes or DEFAULT_MAX_SHARD_BYTES,
        overwrite=args.overwrite,
    )
    print(f"wrote {folder} from step {loaded.step} of {args.run}")
    return 0


def _refuse_an_earlier_export(out: Path, *, adapter: bool) -> None:
    """Before any weights are read: ``out`` must not hold a model (or an adapter) already.

    Raises:
        ConfigError: naming the files there and ``--overwrite``.
    """
    names = {ADAPTER_CONFIG} if adapter else {"config.json"}
    found = sorted(
        path.name
        for path in (out.iterdir() if out.is_dir() else ())
        if path.name in names or (not adapter and path.name.startswith("model"))
    )
    if found:
        what = "an adapter" if adapter else "a model"
        raise ConfigError(
            f"--out {out} already holds {what} ({', '.join(found)}): choose an empty folder, or pass "
            "--overwrite to replace it"
        )
