"""Command line: ``train --config CONFIG [--section.key value ...]`` and ``halyard SUBCOMMAND``.

Subcommands of ``halyard``: ``train`` (as ``train``), ``cache`` (build a token cache offline; the
arguments of ``python -m halyard.data``), ``generate``, ``eval``, ``export`` and ``serve`` (a run's latest
checkpoint; ``serve`` also a Hugging Face folder),
``configs`` (list the built-in configs), ``plot`` and ``replay`` (recompute a step of a run exactly). A config
is a YAML file or the name of a built-in one (``demo``, ``gpt2-small``, ...). Mistakes a user can anticipate
print one line ``error: ...`` (what, where, what to do) and exit with code 2 (bad input: config,
data, tokenizer, checkpoint, mesh, schedule) or 1 (a runtime failure), without a traceback unless
``HALYARD_DEBUG=1`` or ``--debug`` (see `halyard.train.user_errors`); preemption (SIGTERM) saves a
checkpoint and exits with code 143.
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Sequence
from importlib import import_module, metadata

from halyard.train.builtin_configs import builtin_configs, config_summary, resolve_config_paths
from halyard.train.checkpoint.preemption import install_preemption_handler
from halyard.train.user_errors import DEBUG_FLAG, report_user_errors

__all__ = ["builtin_configs", "main", "resolve_config_paths", "train_main"]

SUBCOMMANDS = {
    "train": "halyard.train.commands.train:train_command",
    "cache": "halyard.train.commands.cache:cache_main",
    "generate": "halyard.train.commands.generate:generate_main",
    "export": "halyard.train.commands.export:export_main",
    "eval": "halyard.train.commands.evaluate:eval_main",
    "plan": "halyard.train.plan.command:plan_main",
    "plot": "halyard.train.commands.plot:plot_main",
    "doremi": "halyard.train.commands.doremi:doremi_main",
    "replay": "halyard.train.commands.replay:replay_main",
    "config": "halyard.train.commands.config_show:config_main",
    "serve": "halyard.train.commands.serve:serve_main",
}
"""``halyard`` subcommand -> ``module:function`` taking its arguments; the module is imported only when the
subcommand runs (``halyard configs`` need not import jax)."""

USAGE = """usage: halyard <command> [arguments]

commands:
  train     train a model: halyard train --config demo [--trainer.steps 100 ...]
  cache     build a token cache offline (halyard cache build --help), or describe one:
            halyard cache info runs/demo/cache (a run's data.cache_dir; the cache itself is in tokens/)
  generate  continue a prompt with a run's checkpoint: halyard generate --run runs/demo --prompt "def "
  eval      validation loss / perplexity / bits per byte of a run's checkpoint: halyard eval --run runs/demo;
            lm-evaluation-harness tasks: halyard eval --run runs/demo --tasks hellaswag [--limit 100]
  export    write a Hugging Face folder from a run's checkpoint: halyard export --run runs/demo --out hf/
  serve     an OpenAI-compatible server of a run's checkpoint or a Hugging Face folder:
            halyard serve --run runs/demo [--port 8000] (or --hf FOLDER); halyard serve --help
            a LoRA run: --lora merge (default) | adapter (a PEFT adapter folder) | base
  configs   list the built-in configs
  plan      before launch: memory per device, FLOPs, step time: halyard plan --config llama-8b --devices 64
  config    print a resolved config with every key's meaning: halyard config show demo [--trainer.steps 10]
  plot      the loss of runs, overlaid, as a PNG: halyard plot --run runs/a runs/b [--out loss.png];
            per-layer metrics as a heatmap: halyard plot --run runs/a --metric 'grad_norm/layers/*'
  doremi    learn a mixture's weights (DoReMi: reference run, proxy run, the main run's command):
            halyard doremi --config doremi-demo [--reference RUN] [--main]
  replay    recompute a step exactly from the checkpoint before it: each example's loss and documents,
            the step's per-layer statistics: halyard replay --run runs/demo --step 31

  --version print every installed halyard package and its version
  --debug   show the traceback of an error (also HALYARD_DEBUG=1); errors are one line without it
"""


def installed_versions() -> str:
    """One line per installed ``halyard-*`` distribution, sorted: its name and version."""
    found = {}
    for distribution in metadata.distributions():
        name = (distribution.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("halyard-"):
            found[name] = distribution.version
    return "\n".join(f"{name} {version}" for name, version in sorted(found.items()))


def train_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``train``."""
    return _run_subcommand("train", sys.argv[1:] if argv is None else argv)


def _list_configs() -> int:
    configs = sorted(builtin_configs().items())
    width = max((len(name) for name, _ in configs), default=0)
    for name, path in configs:
        print(f"{name:{width}s}  {config_summary(path)}")
    if configs:
        print(f"\n(files in {configs[0][1].parent}; `halyard config show NAME` prints one resolved)")
    return 0


def _run_subcommand(command: str, argv: Sequence[str]) -> int:
    """Import the module of ``command`` (`SUBCOMMANDS`) and run it on ``argv``; a user's mistake is one line."""
    module, function = SUBCOMMANDS[command].split(":")
    if command != "train":
        return report_user_errors(getattr(import_module(module), function))(argv)
    # Before jax is imported (seconds): Ctrl-C or SIGTERM from the first moment asks the run to stop. Python's
    # own KeyboardInterrupt could be raised inside jax's garbage-collection callback, which swallows it, and
    # the run then trained on.
    preemption = install_preemption_handler((signal.SIGTERM, signal.SIGINT))
    try:
        train = functools.partial(getattr(import_module(module), function), preemption=preemption)
        return report_user_errors(train)(argv)
    except KeyboardInterrupt:  # a second Ctrl-C: stop now, without waiting for the checkpoint
        print("interrupted again: stopped at once; the last complete checkpoint is kept", file=sys.stderr)
        return 130
    finally:
        preemption.uninstall()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``halyard``."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = [DEBUG_FLAG] if DEBUG_FLAG in args else []  # before or after the command: passed on to it
    args = [arg for arg in args if arg != DEBUG_FLAG]
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:] + debug
    if command in ("--version", "-V"):
        print(installed_versions())
        return 0
    if command == "configs":
        return _list_configs()
    if command in SUBCOMMANDS:
        return _run_subcommand(command, rest)
    print(f"halyard: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
