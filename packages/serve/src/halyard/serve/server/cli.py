"""``halyard-serve --hf FOLDER``: serve a Hugging Face folder over OpenAI's API (``halyard serve --run R``
in halyard-train serves a run's checkpoint with the same options).

It listens on 127.0.0.1 unless ``--host`` says otherwise. Ctrl-C or SIGTERM stops it: no new request is
accepted, those running get ``--shutdown-timeout`` seconds to finish (then they end with a 503, or an error
event in a stream, after the engine step running then), the engine's thread ends and the process exits
with code 0; a second Ctrl-C stops at once. Bad options print one line ``error: ...`` and exit with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from halyard.serve.server.backend import start_backend
from halyard.serve.server.host_transfer import size_host_buffer
from halyard.serve.server.lora import lora_specs
from halyard.serve.server.options import (
    OptionError,
    add_server_arguments,
    as_options,
    chat_template_of,
    draft_source,
    engine_config_of,
)

if TYPE_CHECKING:
    from halyard.serve.server.loading import ServedModel

logger = logging.getLogger("halyard.serve.server")


STEP_BACKSTOP_SECONDS = 120
"""How long uvicorn waits for the streams after the drain's end before it closes their connections: the
drain ends them with an error event between two engine steps, and the step running then may be compiling a
new shape (seconds on a loaded CPU, more on a TPU); this only ends a server whose engine thread hangs."""


def run_server(served: ServedModel, args: argparse.Namespace) -> int:
    """Serve ``served`` with the options ``args`` until Ctrl-C or SIGTERM.

    Args:
        served: the model (on one device: ``--tensor`` and ``--replicas`` place it).
        args: options of `add_server_arguments`.

    Returns:
        0 after a clean stop.

    Raises:
        OptionError: the engine options do not fit the model.
    """
    from halyard.serve.server.app import create_app  # FastAPI: imported while the backend starts (`main`)

    logging.basicConfig(format="%(levelname)s:     %(message)s")
    logging.getLogger("halyard.serve.warmup").setLevel(logging.INFO)  # --warmup's progress lines
    config = engine_config_of(args)
    try:
        app = create_app(served, config, api_key=args.api_key, tensor=args.tensor, replicas=args.replicas)
    except OptionError:
        raise
    except ValueError as error:
        raise OptionError(as_options(str(error))) from None
    driver = app.state.server.driver
    logger.warning(
        "halyard serve: %r, context %d tokens, %d pages of %d tokens, %s mode, %d replica(s) of %d device(s), "
        "on %s",
        served.name,
        app.state.server.max_context,
        config.num_pages,
        config.page_size,
        ("deterministic, training arithmetic" if config.training_arithmetic else "deterministic")
        if config.deterministic
        else "fast",
        args.replicas,
        args.tensor,
        f"unix socket {args.uds}" if args.uds else f"http://{args.host}:{args.port}",
    )
    server = _Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            uds=args.uds,
            log_level=args.log_level,
            timeout_graceful_shutdown=int(args.shutdown_timeout) + STEP_BACKSTOP_SECONDS,
        ),
        on_exit=lambda: driver.drain(args.shutdown_timeout),
    )
    # uvicorn raises the signal that stopped it again once it has shut down (for the handlers that were
    # there before); these ones let the process end normally, with code 0.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, _stopped)
    try:
        server.run()
    finally:
        driver.stop()
    return 0 if server.started else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``halyard-serve``."""
    parser = argparse.ArgumentParser(
        prog="halyard-serve",
        description="Serve a Hugging Face folder over OpenAI's API until Ctrl-C or SIGTERM (halyard serve --run R "
        "in halyard-train serves a run's checkpoint with the same options).",
    )
    parser.add_argument("--hf", required=True, help="a Hugging Face folder (config.json, weights, tokenizer)")
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    try:
        engine_config_of(args)  # before the model loads: a bad option costs no loading time
        specs = lora_specs(args.lora)
    except OptionError as error:
        return _bad_input(error)
    size_host_buffer(args.hf, args.dtype)  # the TPU runtime's host buffer, before the runtime starts
    start_backend()  # after the options that must precede it (--training-arithmetic's XLA flag)
    # Imported once the backend's start is under way: on a TPU these imports and the reading overlap it.
    from halyard.data import DataInputError
    from halyard.export import HfConversionError
    from halyard.serve.server.loading import load_hf_folder
    from halyard.serve.server.lora import with_lora

    try:
        served = load_hf_folder(
            args.hf,
            name=args.model_name,
            chat_template=chat_template_of(args),
            dtype=args.dtype,
            quantization=args.quantization,
        )
        served = with_lora(served, specs)
        draft = draft_source(args)
        if draft is not None:
            served = dataclasses.replace(served, draft=load_hf_folder(draft, dtype=args.dtype).model)
        return run_server(served, args)
    except (OptionError, HfConversionError, DataInputError) as error:
        return _bad_input(error)
    except KeyboardInterrupt:  # Ctrl-C while the model loads
        return 130


def _bad_input(error: Exception) -> int:
    """Print ``error`` as one line ``error: ...``; the exit code of bad input, 2."""
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


class _Server(uvicorn.Server):
    """uvicorn's server, telling the engine to drain when the first stop signal arrives."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self._on_exit()
        super().handle_exit(sig, frame)


def _stopped(sig: int, frame: FrameType | None) -> None:
    pass


if __name__ == "__main__":
    raise SystemExit(main())
