"""``halyard serve``: a run's checkpoint (``--run``, the latest complete one unless ``--step``) or a Hugging
Face folder (``--hf``) over OpenAI's API, with halyard.serve's server and its options (``--port``,
``--api-key``, engine sizes...; ``halyard serve --help``)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from halyard.serve.server.backend import start_backend
from halyard.serve.server.host_transfer import size_host_buffer
from halyard.serve.server.lora import lora_specs, with_lora
from halyard.serve.server.options import (
    OptionError,
    add_server_arguments,
    chat_template_of,
    draft_source,
    engine_config_of,
)
from halyard.train.config.errors import ConfigError


def serve_main(argv: Sequence[str]) -> int:
    """Serve a run's checkpoint or a Hugging Face folder until Ctrl-C or SIGTERM (then exit with code 0)."""
    parser = argparse.ArgumentParser(prog="halyard serve", description=serve_main.__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--run", help="a training run folder (trainer.run_dir): its latest complete checkpoint"
    )
    source.add_argument("--hf", help="a Hugging Face folder (config.json, weights, tokenizer files)")
    parser.add_argument("--step", type=int, default=None, help="with --run: the checkpoint's step")
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    if args.step is not None and args.run is None:
        raise ConfigError("--step needs --run (a Hugging Face folder has one set of weights)")
    if args.dtype != "auto" and args.run is not None:
        raise ConfigError(
            f"--dtype {args.dtype} needs --hf: a run's checkpoint is served in its trained dtype"
        )
    try:
        engine_config_of(args)  # before the model loads: a bad option costs no loading time
        specs = lora_specs(args.lora)
        chat_template = chat_template_of(args)
        if args.hf is not None:
            size_host_buffer(args.hf, args.dtype)  # the TPU runtime's host buffer, before the runtime starts
        start_backend()  # after the options that must precede it (--training-arithmetic's XLA flag)
        # Imported once the backend's start is under way: on a TPU these imports and the reading overlap it.
        from halyard.serve.server import load_hf_folder, run_server, served_model

        if args.run is not None:
            from halyard.train.run.loading import load_run_model  # orbax: only for a run's checkpoint

            loaded = load_run_model(Path(args.run), args.step)
            # The engine runs the model on one device, as halyard generate does (not the training mesh).
            name = args.model_name or Path(args.run).resolve().name
            served = served_model(
                jax.device_get(loaded.model), loaded.tokenizer, name, chat_template=chat_template
            )
        else:
            served = load_hf_folder(
                args.hf,
                name=args.model_name,
                chat_template=chat_template,
                dtype=args.dtype,
                quantization=args.quantization,
            )
        from halyard.train.run.loading import load_run_adapters

        served = with_lora(served, specs, load_run_adapters)
        draft = draft_source(args)
        if draft is not None:
            served = dataclasses.replace(served, draft=_draft_model(draft, args.dtype))
        return run_server(served, args)
    except OptionError as error:
        raise ConfigError(str(error)) from None


def _draft_model(folder: Path, dtype: str) -> Any:
    """The model of ``--speculative draft=FOLDER``: a run folder's latest checkpoint (it has no config.json)
    or a Hugging Face folder's weights."""
    if not (folder / "config.json").exists():
        from halyard.train.run.loading import load_run_model

        return jax.device_get(load_run_model(folder, None).model)
    from halyard.serve.server import load_hf_folder

    return load_hf_folder(folder, dtype=dtype).model
