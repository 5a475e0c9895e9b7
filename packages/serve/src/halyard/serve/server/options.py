"""The options of ``halyard-serve`` and ``halyard serve`` (the engine's and the server's) and their checks.

This module imports no web framework and no checkpoint reader: a command parses and checks its options, and
starts JAX's backend (`halyard.serve.server.backend`), before importing those.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
from pathlib import Path

from halyard.named.nn import UNFUSED_FLAG, unfuse_multiply_add
from halyard.serve.config import EngineConfig
from halyard.serve.int8_weights import QUANTIZATIONS

SERVE_DTYPES = ("auto", "float32", "bfloat16")
"""The weights' dtypes a server holds: ``auto`` is the dtype the checkpoint is stored in."""


logger = logging.getLogger("halyard.serve.server")


class OptionError(ValueError):
    """A command-line option the model or the engine cannot take (the message names the option)."""


API_KEY_VARIABLE = "HALYARD_SERVE_API_KEY"
"""The environment variable ``--api-key`` defaults to (a key in the environment stays out of ``ps``)."""

ENGINE_OPTIONS = (
    "page_size", "num_pages", "max_context", "max_running", "chunk_size", "max_prefill_rows", "deterministic_rows",
    "max_n", "compile_threads",
)  # fmt: skip


NAMED_FLAGS = ("quantization", "training_arithmetic", "speculative_tokens")
"""`EngineConfig` fields besides `ENGINE_OPTIONS` that its messages name and that are options of the same name."""


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the engine's and the server's options (everything but where the model comes from)."""
    defaults = EngineConfig()
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    engine = parser.add_argument_group("engine")
    helps = {
        "page_size": "tokens per KV page",
        "num_pages": "KV pages in the pool (KV memory: num-pages * page-size tokens of every layer)",
        "max_context": "the longest sequence, prompt plus completion (default: the model's positions, else 4096)",
        "max_running": "the most sequences decoding at once (rows of the decoding program)",
        "chunk_size": "the most prompt tokens a sequence is fed per step (chunked prefill)",
        "max_prefill_rows": "the most sequences prefilled in one step, beyond those that fill its program's padding",
        "deterministic_rows": "with --deterministic: the most rows of one step program (default: --max-running, "
        "one program a step; fewer split a step into several)",
        "max_n": "the most samples (n) one request may ask for, over all its prompts; a request's samples must "
        "also fit the pool together",
        "compile_threads": "with --warmup: step programs compiled at once (default: the machine's cores)",
    }
    for name in ENGINE_OPTIONS:
        default = getattr(defaults, name)
        engine.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=default,
            help=f"{helps[name]} (default: {default})" if fields[name].default is not None else helps[name],
        )
    engine.add_argument(
        "--deterministic",
        action="store_true",
        help="a request's tokens and log-probs are bitwise the same whatever runs beside it, wherever its "
        "prompt's chunks end, whether it was preempted or read its prefix from the cache: batch-invariant "
        "step programs (products in fixed blocks of rows, sums in a fixed order)",
    )
    engine.add_argument(
        "--training-arithmetic",
        action="store_true",
        help="--deterministic in a process without fused multiply-adds: log-probs equal a GRPO trainer's "
        "(the training step's batch-invariant arithmetic) bit for bit",
    )
    engine.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="none",
        help="int8: hold the attention and MLP weights and the output head as int8 with a scale per output "
        "channel (half their bytes); not with --training-arithmetic (default: none)",
    )
    engine.add_argument(
        "--speculative",
        metavar="ngram|draft=MODEL",
        default=None,
        help="speculative decoding: each decoding row proposes --speculative-tokens tokens, verified in one "
        "step (the same tokens as without): ngram (prompt lookup: what followed the latest occurrence of the "
        "last tokens in the prompt and output) or draft=MODEL (a small model with the same tokenizer: a run "
        "folder or a Hugging Face folder) (default: none)",
    )
    engine.add_argument(
        "--speculative-tokens",
        type=int,
        default=defaults.speculative_tokens,
        help=f"with --speculative: the most tokens a row proposes a step (default: {defaults.speculative_tokens})",
    )
    engine.add_argument(
        "--no-prefix-cache", action="store_true", help="do not share the pages of common prompt prefixes"
    )
    engine.add_argument(
        "--warmup",
        action="store_true",
        help="compile every step program before serving, with a progress line per shape, so that no "
        "request waits for a compile",
    )
    engine.add_argument(
        "--warmup-logprobs",
        action="store_true",
        help="with --warmup, also compile the programs of requests asking for top log-prob alternatives or "
        "prompt log-probs (four times the programs)",
    )
    engine.add_argument(
        "--compilation-cache",
        metavar="DIR",
        default=None,
        help="keep compiled programs in JAX's persistent compilation cache in DIR: a second start loads "
        "them (default: none, unless JAX_COMPILATION_CACHE_DIR is set)",
    )
    engine.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="copies of the engine, each on its own --tensor devices; a request goes to the least busy "
        "(data parallel, for throughput) (default: 1)",
    )
    engine.add_argument(
        "--tensor",
        type=int,
        default=1,
        help="split the model over this many devices, tensor parallel: heads, kv heads, MLP and vocabulary "
        "(and the KV pages on kv heads) (default: 1)",
    )
    engine.add_argument(
        "--seed", type=int, default=defaults.seed, help="draws the seeds of requests that give none"
    )
    engine.add_argument(
        "--dtype",
        choices=SERVE_DTYPES,
        default="auto",
        help="the weights' dtype in memory (default: auto, the dtype the checkpoint is stored in: config.json's "
        "dtype / torch_dtype for a folder, the trained parameters' for a run; float32 when it names none)",
    )
    server = parser.add_argument_group("server")
    server.add_argument(
        "--lora",
        action="append",
        metavar="NAME=FOLDER",
        help="serve a LoRA adapter beside the base: requests with model NAME run it, in the same batches as "
        "the base's (repeatable; FOLDER: a PEFT adapter folder, or with halyard serve a run trained with LoRA)",
    )
    server.add_argument(
        "--model-name", help="the name /v1/models lists and requests give (default: the folder's)"
    )
    server.add_argument("--chat-template", help="a Jinja file replacing the tokenizer's chat template")
    server.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    server.add_argument("--port", type=int, default=8000, help="the port (default: 8000)")
    server.add_argument(
        "--uds",
        metavar="PATH",
        default=None,
        help="listen on this unix socket instead of --host and --port (a machine that allows no TCP socket)",
    )
    server.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_VARIABLE),
        help=f"require 'Authorization: Bearer KEY' on /v1 routes (default: ${API_KEY_VARIABLE}, else none)",
    )
    server.add_argument(
        "--shutdown-timeout",
        type=float,
        default=5.0,
        help="seconds running requests get to finish after Ctrl-C or SIGTERM (default: 5)",
    )
    server.add_argument("--log-level", default="info", help="uvicorn's log level (default: info)")


def engine_config_of(args: argparse.Namespace) -> EngineConfig:
    """The `EngineConfig` of parsed options. With ``--training-arithmetic`` it also asks XLA for no fused
    multiply-adds (`halyard.named.nn.unfuse_multiply_add`): the commands call it before JAX starts.

    Raises:
        OptionError: an option out of range (named as on the command line).
    """
    values = {name: getattr(args, name) for name in ENGINE_OPTIONS}
    speculative = speculative_method(args.speculative)
    try:
        config = EngineConfig(
            **values,
            deterministic=args.deterministic or args.training_arithmetic,
            training_arithmetic=args.training_arithmetic,
            prefix_cache=not args.no_prefix_cache,
            seed=args.seed,
            warmup=args.warmup,
            warmup_logprobs=args.warmup_logprobs,
            compilation_cache=args.compilation_cache,
            quantization=args.quantization,
            speculative=speculative,
            speculative_tokens=args.speculative_tokens,
        )
    except ValueError as error:
        raise OptionError(as_options(str(error))) from None
    if config.training_arithmetic and not unfuse_multiply_add():
        logger.warning(
            "--training-arithmetic: XLA already started with fused multiply-adds (or this is no x86 CPU): "
            "log-probs agree with the trainer's to rounding only; start the process with XLA_FLAGS=%s",
            UNFUSED_FLAG,
        )
    return config


def speculative_method(value: str | None) -> str:
    """`EngineConfig.speculative` of ``--speculative`` (None: ``none``).

    Raises:
        OptionError: neither ``ngram`` nor ``draft=MODEL``.
    """
    if value is None:
        return "none"
    if value == "ngram" or (value.startswith("draft=") and len(value) > len("draft=")):
        return value.split("=", 1)[0]
    raise OptionError(
        f"--speculative {value}: give ngram (prompt lookup) or draft=MODEL (a run folder or a Hugging Face folder)"
    )


def draft_source(args: argparse.Namespace) -> Path | None:
    """The folder of ``--speculative draft=MODEL`` (None without one).

    Raises:
        OptionError: the folder does not exist.
    """
    if args.speculative is None or not args.speculative.startswith("draft="):
        return None
    folder = Path(args.speculative.split("=", 1)[1])
    if not folder.is_dir():
        raise OptionError(
            f"--speculative draft={folder}: no such folder; give a run folder or a Hugging Face folder"
        )
    return folder


def as_options(message: str) -> str:
    """An `EngineConfig` message with its fields named as command-line options (``--num-pages``)."""
    pattern = r"\b(?:EngineConfig\.)?(" + "|".join((*ENGINE_OPTIONS, *NAMED_FLAGS)) + r")\b"
    return re.sub(pattern, lambda m: "--" + m.group(1).replace("_", "-"), message)


def chat_template_of(args: argparse.Namespace) -> str | None:
    """The text of ``--chat-template`` (None when not given).

    Raises:
        OptionError: the file cannot be read.
    """
    if args.chat_template is None:
        return None
    try:
        return Path(args.chat_template).read_text(encoding="utf-8")
    except OSError as error:
        raise OptionError(
            f"--chat-template {args.chat_template}: cannot be read ({error.strerror})"
        ) from None
