"""Command line: ``train --config CONFIG [--section.key value ...]`` and ``halyard SUBCOMMAND``.

Subcommands of ``halyard``: ``train`` (as ``train``), ``cache`` (build a token cache offline; the
arguments of ``python -m halyard.data``), ``generate``, ``eval`` and ``export`` (a run's latest checkpoint),
``configs`` (list the built-in configs). A config is a YAML
file or the name of a built-in one (``demo``, ``gpt2-small``, ...). Config mistakes exit with code 2
and a message naming the key; preemption (SIGTERM) saves a checkpoint and exits with code 143.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from halyard.train.config import ConfigError, exit_on_config_error, parse_config

USAGE = """usage: halyard <command> [arguments]

commands:
  train     train a model: halyard train --config demo [--trainer.steps 100 ...]
  cache     build a token cache offline (python -m halyard.data build --help)
  generate  continue a prompt with a run's checkpoint: halyard generate --run runs/demo --prompt "def "
  eval      validation loss / perplexity / bits per byte of a run's checkpoint: halyard eval --run runs/demo
  export    write a Hugging Face folder from a run's checkpoint: halyard export --run runs/demo --out hf/
  configs   list the built-in configs
  plan      before launch: memory per device, FLOPs, step time: halyard plan --config llama-8b --devices 64

  --version print every installed halyard package and its version
"""


def builtin_configs() -> dict[str, Path]:
    """Built-in config name -> path of its YAML file."""
    folder = resources.files("halyard.train") / "configs"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".yaml")}


def resolve_config_paths(argv: Sequence[str]) -> list[str]:
    """Replace ``--config NAME`` of a built-in config by its file path (a file of that name wins)."""
    builtin = builtin_configs()
    resolved = list(argv)
    for i, arg in enumerate(resolved):
        value_index = None
        if arg == "--config" and i + 1 < len(resolved):
            value_index = i + 1
        elif arg.startswith("--config="):
            name = arg.split("=", 1)[1]
            if not Path(name).exists() and name in builtin:
                resolved[i] = f"--config={builtin[name]}"
        if value_index is not None:
            name = resolved[value_index]
            if not Path(name).exists() and name in builtin:
                resolved[value_index] = str(builtin[name])
    return resolved


def installed_versions() -> str:
    """One line per installed ``halyard-*`` distribution, sorted: its name and version."""
    from importlib import metadata

    found = {}
    for distribution in metadata.distributions():
        name = (distribution.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("halyard-"):
            found[name] = distribution.version
    return "\n".join(f"{name} {version}" for name, version in sorted(found.items()))


@exit_on_config_error
def _run_training(argv: Sequence[str]) -> int:
    from halyard.shard import initialize
    from halyard.train.run_config import TrainConfig

    config = parse_config(TrainConfig, resolve_config_paths(argv), prog="train")
    initialize()
    from halyard.train.checkpoint import CheckpointWriteError
    from halyard.train.trainer.trainer import NonFiniteLossError, Trainer

    try:
        trainer = Trainer(config)
    except ValueError as error:  # an impossible mesh, layout or shape: a config mistake (exit 2)
        raise ConfigError(str(error)) from None
    try:
        result = trainer.fit()
    except (CheckpointWriteError, NonFiniteLossError) as error:  # a complete message: no traceback
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    if result.last_metrics:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(result.last_metrics.items()) if k != "step")
        print(f"finished at step {int(result.state.step)}: {shown}", flush=True)
    return 0


def train_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``train``."""
    return _run_training(sys.argv[1:] if argv is None else argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``halyard``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command in ("--version", "-V"):
        print(installed_versions())
        return 0
    if command == "train":
        return _run_training(rest)
    if command == "cache":
        from halyard.data.cli import main as data_main

        return int(data_main(rest) or 0)
    if command in ("generate", "eval", "export"):
        from halyard.train import run_tools

        tools = {
            "generate": run_tools.generate_main,
            "eval": run_tools.eval_main,
            "export": run_tools.export_main,
        }
        return exit_on_config_error(tools[command])(rest)
    if command == "plan":
        from halyard.train.plan.command import plan_main

        return plan_main(rest)
    if command == "configs":
        for name, path in sorted(builtin_configs().items()):
            print(f"{name:16s} {path}")
        return 0
    print(f"halyard: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
