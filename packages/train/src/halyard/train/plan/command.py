"""The ``halyard plan`` command: options, simulated devices (re-running itself when needed), the report."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import jax
from jax._src import xla_bridge

from halyard.models.decoder.pipeline import PipelineSchedule
from halyard.shard import MESH_AXES
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.errors import ConfigError, exit_on_config_error
from halyard.train.config.parse import parse_config
from halyard.train.plan.accelerators import Accelerator, accelerator
from halyard.train.plan.step_memory import StepMemory, step_memory
from halyard.train.plan.tpu_topology import LIBTPU_HINT, TOPOLOGIES, topology_devices
from halyard.train.run_config import TrainConfig

CHILD_ENV = "HALYARD_PLAN_CHILD"
"""Set in the process `plan_main` re-runs itself in, so it never re-runs twice."""

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"

LONG_SEQUENCE = 8192
"""From this `data.seq_len` on, a step that does not fit is also told to split its sequences (context
parallelism)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="halyard plan",
        description="Before launch: memory per device of the compiled train step on the configured mesh and "
        "layout, FLOPs per token, and the step time at a given MFU. Config overrides (--trainer.batch_size "
        "64 ...) follow the options.",
    )
    parser.add_argument("--config", action="append", required=True, help="a YAML file or built-in config")
    parser.add_argument(
        "--devices", type=int, default=None, help="devices of the run (default: the mesh's sizes, else 8)"
    )
    parser.add_argument(
        "--accelerator", default="H100 SXM", help="chip of the peaks table (default H100 SXM)"
    )
    parser.add_argument(
        "--memory-gib", type=float, default=None, help="memory per chip, instead of the table's"
    )
    parser.add_argument(
        "--mfu", type=float, default=0.4, help="model FLOPs utilisation to expect (default 0.4)"
    )
    return parser


@exit_on_config_error
def plan_main(argv: Sequence[str]) -> int:
    """``halyard plan --config X [--devices N] [--accelerator A] [overrides]``: print the plan."""
    options, overrides = _parser().parse_known_args(list(argv))
    if not 0 < options.mfu <= 1:
        raise ConfigError(f"--mfu {options.mfu}: give a share between 0 and 1, e.g. 0.4.")
    config_args = [arg for path in options.config for arg in ("--config", path)]
    config = parse_config(TrainConfig, resolve_config_paths([*config_args, *overrides]), prog="halyard plan")
    num_devices = options.devices or _mesh_device_count(config.trainer.mesh)
    if num_devices < 1:
        raise ConfigError(f"--devices {num_devices}: give a positive number of devices.")
    # The model section's dtypes are the run's, also under trainer.init=hf: (they override the HF config).
    model: Any = config.model
    chip = accelerator(options.accelerator, model.compute.name, options.memory_gib)
    topology = topology_devices(chip.name, num_devices)
    devices, compiled_for = topology if topology is not None else (_simulated_devices(num_devices), None)
    if devices is None:
        return _rerun_with_devices(argv, num_devices)
    where = compiled_for or f"{num_devices} simulated devices"
    print(f"compiling the train step for the {where} ...", file=sys.stderr, flush=True)
    try:
        memory = step_memory(config, devices, chip.backend)
        # The invariant step's cost is what it holds beyond the default step's, so a plan shows both.
        default = (
            step_memory(without_invariant(config), devices, chip.backend)
            if config.trainer.invariant
            else None
        )
    except jax.errors.JaxRuntimeError as error:
        if compiled_for is None or "RESOURCE_EXHAUSTED" not in str(error):
            raise
        # The TPU's compiler refuses a program larger than the chip: that is the plan's answer.
        print(f"DOES NOT FIT on {chip.name} ({compiled_for}): {str(error).splitlines()[0]}")
        return 0
    print(format_plan(config, memory, chip, options.mfu, default=default, compiled_for=compiled_for))
    return 0


def without_invariant(config: TrainConfig) -> TrainConfig:
    """``config`` with ``trainer.invariant`` off: the default step of the same run."""
    return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, invariant=False))


def format_plan(
    config: TrainConfig,
    memory: StepMemory,
    chip: Accelerator,
    mfu: float,
    default: StepMemory | None = None,
    compiled_for: str | None = None,
) -> str:
    """The report: memory per device with the fit verdict, then FLOPs and the expected step time.

    Args:
        config: the run config.
        memory: its compiled step's memory.
        chip: the accelerator planned for.
        mfu: the model FLOPs utilisation the step time assumes.
        default: with ``trainer.invariant``, the default step's memory, printed beside the invariant one's.
        compiled_for: the TPU topology the step compiled for (`tpu_topology.topology_devices`'s line); None:
            simulated CPU devices, whose figures are an estimate.
    """
    trainer, seq_len = config.trainer, config.data.seq_len
    model: Any = config.model
    tokens = trainer.batch_size * seq_len
    flops_per_token = memory.flops_per_token
    step_flops = flops_per_token * tokens
    ideal = step_flops / (memory.num_devices * chip.peak_flops)
    mesh = " ".join(f"{axis}={size}" for axis, size in memory.mesh.items()) or "one device"
    fits = memory.total <= chip.usable_bytes
    # A TPU's verdict comes from its own compiler: the CPU's estimate measured 0.81-1.43x the chip's figure.
    verdict = compiled_for is not None or chip.backend != "tpu"
    lines = [
        f"model     {memory.model_family} {_count(memory.num_params)} parameters, remat={memory.remat}"
        + (
            f", {_count(memory.trained_params)} trained (LoRA adapters)"
            if memory.trained_params is not None
            else ""
        ),
        f"run       {memory.num_devices} devices (mesh {mesh}), layout {trainer.layout}, "
        f"precision params={model.params.name} compute={model.compute.name}",
        f"batch     {trainer.batch_size} x {seq_len} = {tokens:,} tokens a step, "
        f"accumulation {trainer.accumulation}",
        *_pipeline_line(memory.mesh.get("stage", 1), model),
        "",
        "memory per device (XLA's memory analysis of the compiled step)",
        *_memory_rows(config, memory, default),
        (
            f"{'fits' if fits else 'DOES NOT FIT'} on {chip.name}: {_gib(memory.total)} of "
            if verdict
            else f"no fit verdict for {chip.name} (the CPU's estimate, not the TPU compiler's): "
            f"{_gib(memory.total)} against "
        )
        + f"{_gib(chip.usable_bytes)} usable ({chip.usable_fraction:.0%} of {chip.memory_gib:g} GiB)",
        *([] if verdict else [f"  for the verdict: {_tpu_compiler_hint(chip)}"]),
    ]
    if verdict and not fits:
        knobs = ["raise trainer.accumulation"]
        knobs += ["set model.remat full"] if memory.remat != "full" else []
        knobs += ["trainer.layout fsdp"] if trainer.layout == "data_parallel" else []
        if model.params.itemsize > 2:
            knobs += ["model.param_dtype bfloat16 with model.optimizer_dtype float32"]
        if not memory.optimizer_on_host:
            knobs += ["trainer.offload_optimizer_state true"]
        if config.data.seq_len >= LONG_SEQUENCE:
            knobs += ["split each sequence over more devices (trainer.mesh.sequence)"]
        knobs += ["lower trainer.batch_size or data.seq_len", "use more devices (--devices)"]
        lines.append(f"  to fit: {', '.join(knobs)}")
    lines += [
        "",
        f"compute on {chip.name} ({chip.dtype} peak {chip.peak_flops / 1e12:g} TFLOP/s per chip)",
        f"  FLOPs per token     {flops_per_token:.3g} (forward + backward, model FLOPs)",
        f"  FLOPs per step      {step_flops:.3g}",
        f"  step time           {ideal:.3g} s at 100% MFU, {ideal / mfu:.3g} s at {mfu:.0%} MFU "
        f"({tokens / (ideal / mfu):,.0f} tokens/s)",
        *_compiler_lines(memory, compiled_for),
    ]
    return "\n".join(lines)


def _compiler_lines(memory: StepMemory, compiled_for: str | None) -> list[str]:
    """What compiled the step: the TPU's compiler for its topology, else simulated CPU devices (an estimate)."""
    seconds = f"{memory.compile_seconds:.0f} s"
    if compiled_for is not None:
        return [f"  (compiled in {seconds} for the {compiled_for}: the chip's own memory analysis)"]
    return [
        f"  (compiled in {seconds} on simulated CPU devices: XLA's CPU buffer assignment, an ESTIMATE of the "
        "accelerator's)"
    ]


def _tpu_compiler_hint(chip: Accelerator) -> str:
    """How to get a TPU plan compiled by the TPU's own compiler."""
    if chip.name in TOPOLOGIES:
        return f"get libtpu, then plan again: {LIBTPU_HINT}"
    return (
        f"this plan compiles for the topologies of {', '.join(TOPOLOGIES)} only (with libtpu); "
        f"a {chip.name}'s memory is not checked here"
    )


def _memory_rows(config: TrainConfig, memory: StepMemory, default: StepMemory | None) -> list[str]:
    """The memory table's rows: each part of the step's memory, the total, and the default step's total
    beside an invariant step's."""
    model: Any = config.model
    return [
        *(
            [_row("frozen base", memory.frozen_params, "LoRA: no gradients, no optimizer state")]
            if memory.trained_params is not None
            else []
        ),
        _row(
            "parameters",
            memory.params,
            "the layout's shards" if memory.trained_params is None else "the adapters",
        ),
        _row(
            "optimizer state",
            memory.optimizer_state,
            type(config.optimizer).__name__
            + (f" in {model.optimizer.name}" if model.optimizer != model.params else "")
            + (
                ", in host memory (trainer.offload_optimizer_state): not in the total"
                if memory.optimizer_on_host
                else ""
            ),
        ),
        _row("gradients", memory.gradients, "one per parameter, in its shard (of the temporaries)"),
        _row("activations", memory.activations, "saved for the backward pass, and workspace"),
        _row("batch", memory.batch, "int32 tokens and segment ids"),
        *(
            [_row("engine pages", memory.engine_pages, "grpo: the rollout engine's KV pool")]
            if memory.engine_pages
            else []
        ),
        *(
            [_row("reference", memory.reference_params, "grpo: the frozen model of the KL term")]
            if memory.reference_params
            else []
        ),
        _row("total", memory.total, "arguments + temporaries + outputs not aliased"),
        *(
            [
                _row(
                    "default step",
                    default.total,
                    f"trainer.invariant=false; the invariant step holds {memory.total / default.total:.2f}x",
                )
            ]
            if default is not None
            else []
        ),
    ]


def _pipeline_line(stages: int, model: Any) -> list[str]:
    """The pipeline's schedule and bubble, when the mesh has a ``stage`` axis (each device's memory above is
    one stage's)."""
    if stages < 2:
        return []
    schedule = PipelineSchedule(stages, model.pipeline_repeats, model.pipeline_microbatches)
    return [
        f"pipeline  {stages} stages x {schedule.repeats} repeats, {schedule.microbatches} microbatches: "
        f"{schedule.iterations} iterations, bubble {schedule.bubble:.1%} (each device holds one stage)"
    ]


def _row(name: str, size: int, note: str) -> str:
    return f"  {name:16s} {_gib(size):>11s}   {note}"


def _gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**24 else f"{size / 2**20:.2f} MiB"


def _count(number: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if number >= scale:
            return f"{number / scale:.2f}{unit}"
    return str(number)


def _mesh_device_count(mesh: object) -> int:
    sizes = [getattr(mesh, axis) for axis in MESH_AXES]
    return math.prod(sizes) if -1 not in sizes else 8


def _simulated_devices(count: int) -> list | None:
    """``count`` CPU devices of this process, or None when jax already started with fewer.

    XLA reads the device count when jax initialises its backends, so it is set here if that has not
    happened yet.
    """
    if not xla_bridge.backends_are_initialized():
        os.environ["XLA_FLAGS"] = _with_device_count(os.environ.get("XLA_FLAGS", ""), count)
        jax.config.update("jax_platforms", "cpu")
    devices = jax.devices("cpu")
    return list(devices[:count]) if len(devices) >= count else None


def _with_device_count(flags: str, count: int) -> str:
    kept = re.sub(rf"{DEVICE_COUNT_FLAG}=\d+", "", flags).split()
    return " ".join([*kept, f"{DEVICE_COUNT_FLAG}={count}"])


def _rerun_with_devices(argv: Sequence[str], count: int) -> int:
    if os.environ.get(CHILD_ENV):
        raise ConfigError(
            f"could not start {count} simulated CPU devices (XLA_FLAGS={os.environ.get('XLA_FLAGS')})."
        )
    env = dict(os.environ, JAX_PLATFORMS="cpu", **{CHILD_ENV: "1"})
    env["XLA_FLAGS"] = _with_device_count(env.get("XLA_FLAGS", ""), count)
    return subprocess.run([sys.executable, "-m", "halyard.train.plan", *argv], env=env).returncode
