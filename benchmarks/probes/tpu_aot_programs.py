"""What the engine's TPU step programs cost to trace, lower and compile, measured on a CPU: each program of
Qwen2.5-0.5B's shape (bf16, its vocabulary cut to 4,096) is built as on a v5e, with the Pallas kernels the chip
runs (not the interpreter), and compiled by libtpu's compiler for a one-chip v5e topology (`make venv` puts
libtpu in .venv/libtpu; `halyard plan --accelerator "TPU v5e"` compiles the same way). Nothing runs: this
times a start's program work (trace, lowering, the TPU compiler) without the chip, so a change to a kernel's
compile cost can be measured here before it goes to the chip.

Two things are told about the chip that a CPU process cannot ask for: the paged kernel is `PallasPagedKernel`
outside the interpreter (`paged_kernel` picks by the default backend), and JAX's tuned block-size table
(`tuned_block_sizes`, which asks ``jax.devices()``) is read for the v5e.

Usage::

    python benchmarks/probes/tpu_aot_programs.py                          # the default shapes
    python benchmarks/probes/tpu_aot_programs.py --shapes 1,1,1 1,1,16    # tokens,sequences,pages of each program

Results: printed, and JSON (``--output``, default benchmarks/results/tpu_aot_programs.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.experimental.pallas.ops.tpu.ragged_paged_attention.tuned_block_sizes as tuned_block_sizes
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import halyard.models.decoder.model as decoder_model
from halyard.export.config_reading import config_from_hf_dict
from halyard.models import init_model
from halyard.models.attention.ragged_paged_pallas import PallasPagedKernel
from halyard.serve import runner as step_runner
from halyard.serve.packed_inputs import pack
from halyard.serve.runner import ModelRunner, ProgramShape
from halyard.train.plan.tpu_topology import topology_devices

ROOT = Path(__file__).resolve().parents[2]
QWEN_CONFIG = ROOT / "packages/export/tests/fixtures/hf-configs/qwen2/Qwen2.5-0.5B.json"
RESULTS = Path(__file__).resolve().parents[1] / "results" / "tpu_aot_programs.json"
SHAPES = ("1,1,1", "1,1,4", "1,1,16", "64,64,16", "128,1,2")
"""Decode programs of one sequence over 1, 4 and 16 pages, 64 sequences over 16 pages, a prefill chunk."""


def tell_the_chip() -> None:
    """The two answers a CPU process cannot get (module docstring)."""
    decoder_model.paged_kernel = lambda implementation="auto": PallasPagedKernel(interpret=False)  # type: ignore[assignment]
    tuned_block_sizes.get_tpu_version = lambda: 5
    tuned_block_sizes.get_device_name = lambda num_devices=None: (
        "TPU v5" + ("" if num_devices is None else f"-{num_devices}")
    )


def engine_runner(page_size: int = 64) -> ModelRunner:
    """The engine's model runner for Qwen2.5-0.5B's shape in bf16, its vocabulary cut to 4,096 (the programs'
    structure without 0.5 GB of embedding)."""
    raw = json.loads(QWEN_CONFIG.read_text())
    raw["vocab_size"] = 4096
    config, _ = config_from_hf_dict(raw, overrides={"param_dtype": "bfloat16"})
    return ModelRunner(
        init_model(config, jax.random.key(0)), num_pages=256, page_size=page_size, max_seq_pages=16,
        max_tokens=192, max_seqs=64, kernel="pallas",
    )  # fmt: skip


def step_program(
    runner: ModelRunner, text: str, devices: list[Any]
) -> tuple[Any, tuple[tuple[Any, ...], dict[str, Any]]]:
    """The jitted step and its abstract arguments ``(args, kwargs)`` for the ``tokens,sequences,pages`` program
    ``text``, placed on ``devices[0]``."""
    tokens, seqs, pages = (int(part) for part in text.split(","))
    chip = NamedSharding(Mesh(devices[:1], ("chip",)), PartitionSpec())

    def on_chip(tree: Any) -> Any:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=chip), tree)

    buffer, previous, packing = pack(runner.example_inputs(ProgramShape(tokens, seqs, pages, False, False)))
    step = jax.jit(
        step_runner._step, static_argnames=("packing", "invariant", "alternatives"), donate_argnums=(1,)
    )
    arguments = (on_chip(runner.model), on_chip(runner.paged_kv), on_chip(buffer), on_chip(previous))
    return step, (arguments, dict(packing=packing, invariant=False, alternatives=False))


def decode_program(text: str, *, chip: bool) -> tuple[Any, tuple[tuple[Any, ...], dict[str, Any]], list[Any]]:
    """`step_program` of ``text`` and the devices it is for: this process's TPU (``chip``), else a v5e
    topology's devices with the chip's answers told (`tell_the_chip`)."""
    if chip:
        devices = jax.devices()
    else:
        found = topology_devices("TPU v5e", 1)
        if found is None:
            raise SystemExit("no libtpu here: `make venv` installs it, or set TPU_LIBRARY_PATH")
        devices = list(found[0])
        tell_the_chip()
    return (*step_program(engine_runner(), text, devices), devices)


def program_costs(shapes: list[str], page_size: int) -> list[dict[str, Any]]:
    """Trace, lower and compile each ``tokens,sequences,pages`` program for the v5e; seconds of each."""
    found = topology_devices("TPU v5e", 1)
    if found is None:
        raise SystemExit("no libtpu here: `make venv` installs it, or set TPU_LIBRARY_PATH")
    devices, line = found
    print(line, flush=True)
    tell_the_chip()
    runner = engine_runner(page_size)
    results = []
    for text in shapes:
        step, (arguments, static) = step_program(runner, text, list(devices))
        started = time.perf_counter()
        with jax.default_device(devices[0]):  # Pallas asks the default device which chip it lowers for
            traced = step.trace(*arguments, **static)
            traced_at = time.perf_counter()
            lowered = traced.lower()
        lowered_at = time.perf_counter()
        lowered.compile()
        tokens, sequences, pages = (int(part) for part in text.split(","))
        done = dict(
            tokens=tokens, sequences=sequences, pages=pages, trace_seconds=traced_at - started,
            lower_seconds=lowered_at - traced_at, compile_seconds=time.perf_counter() - lowered_at,
        )  # fmt: skip
        print(
            "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in done.items()),
            flush=True,
        )
        results.append(done)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", nargs="+", default=list(SHAPES), help="tokens,sequences,pages of each program"
    )
    parser.add_argument(
        "--page-size", type=int, default=64, help="the engine's page size (EngineConfig's default)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = dict(
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), jax=jax.__version__,
        programs=program_costs(args.shapes, args.page_size),
    )  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
