"""What one device holds during a train step, from XLA's memory analysis of the compiled step.

The step is the trainer's own (`RunSetup.train_step`), lowered on abstract inputs
(`jax.ShapeDtypeStruct` with the layout's shardings) and compiled for the configured mesh: nothing
is allocated, so an 8B model plans on a laptop with simulated CPU devices. It is traced as for the
accelerator planned (`halyard.named.nn.compiling_for`): the accelerator's matmuls where they differ from
the CPU's; the blocked attention kernel stands in for the TPU's splash kernel (the same residuals). With ``trainer.offload_optimizer_state`` the optimizer state is in host memory, not in
the device's total (the CPU's analysis counts host and device memory as one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from halyard.named.nn import compiling_for
from halyard.shard import default_batch_axes, mesh_axis_sizes, use_layout
from halyard.train.config.errors import ConfigError
from halyard.train.doremi.step import REFERENCE_MODEL
from halyard.train.mixture.config import mixture_sources
from halyard.train.objectives.dpo import PAIR_KEYS, REFERENCE_KEYS
from halyard.train.plan.int8_matmuls import Int8Matmuls, int8_matmuls
from halyard.train.run.setup import RunSetup
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.preflight import check_shapes


@dataclass(frozen=True)
class StepMemory:
    """Bytes per device of one compiled train step (all figures are for one device)."""

    num_devices: int
    """Devices of the mesh."""
    mesh: dict[str, int]
    """Mesh axis sizes."""
    model_family: str
    """The model's family (`type:`), after `trainer.init: hf:` resolved it."""
    remat: str
    """The model's remat policy."""
    num_params: int
    """Parameters of the model (whole model, not per device)."""
    flops_per_token: float
    """Model FLOPs (forward + backward) per token at `data.seq_len`."""
    params: int
    """The trained parameters' shards on one device (with LoRA: the adapters)."""
    optimizer_state: int
    """The optimizer state's shards on one device (in its host memory with `optimizer_on_host`)."""
    batch: int
    """The batch's shard on one device."""
    gradients: int
    """Gradients, one per parameter in its dtype and sharding: part of `temporaries`."""
    temporaries: int
    """XLA's temporary buffers of the step: activations kept for the backward pass, gradients, workspace."""
    arguments: int
    """XLA's argument buffers (state and batch)."""
    outputs_not_aliased: int
    """Output buffers that do not reuse a donated argument (metrics; the new state reuses the old)."""
    compile_seconds: float
    """Time to lower and compile the step."""
    frozen_params: int = 0
    """A LoRA run's frozen base: its shards on one device (an argument of the step, without gradients or optimizer state)."""
    trained_params: int | None = None
    """Parameters that train (None: all of `num_params`; with LoRA the adapters')."""
    engine_pages: int = 0
    """trainer.objective=grpo: the inference engine's page pool on one device (rl.max_running sequences of data.seq_len tokens; pages split over the tensor axis only)."""
    reference_params: int = 0
    """trainer.objective=grpo with rl.kl_beta: the frozen reference model's shards on one device."""
    optimizer_on_host: bool = False
    """trainer.offload_optimizer_state: the optimizer state lives in host memory (not in `total`)."""
    target_backend: str | None = None
    """The backend the step was traced for (None: the compiling one's)."""
    int8_matmuls: Int8Matmuls | None = None
    """With ``model.quantization: int8``: the int8 products of the lowered step (None otherwise)."""
    int8_flops_per_token: float = 0.0
    """Of `flops_per_token`, what runs as int8 (the layers' projections under ``model.quantization: int8``)."""

    @property
    def activations(self) -> int:
        """Temporaries other than the gradients: saved activations and workspace."""
        return max(self.temporaries - self.gradients, 0)

    @property
    def total(self) -> int:
        """Peak bytes of the step on one device: arguments + temporaries + outputs that are not aliased, plus
        what a GRPO run keeps beside the step (the engine's pages, the reference)."""
        return (
            self.arguments
            + self.temporaries
            + self.outputs_not_aliased
            + self.engine_pages
            + self.reference_params
        )


def step_memory(
    config: TrainConfig, devices: Sequence[jax.Device], target_backend: str | None = None
) -> StepMemory:
    """Compile the run's train step for ``devices`` on abstract inputs and read its memory per device.

    Args:
        config: the run config (its mesh must fit ``len(devices)`` devices).
        devices: the mesh's devices (simulated CPU devices do: only shapes and shardings matter; a TPU
            topology's devices compile the TPU's own program, `halyard.train.plan.tpu_topology`).
        target_backend: trace the step as for this backend (``tpu``, ``gpu``); None: the devices' own.

    Raises:
        ConfigError: a mesh, layout or batch that does not fit these devices.
    """
    started = time.perf_counter()
    try:
        setup = RunSetup(config, devices=list(devices))
        check_shapes(setup)
        abstract, shardings = setup.abstract_state
    except ValueError as error:
        raise ConfigError(str(error)) from None
    state = _with_shardings(abstract, shardings)
    batch = _abstract_batch(config, setup)
    frozen = None
    if config.lora.enabled:  # the frozen base: the whole model, placed as training places it
        abstract_model = jax.eval_shape(setup.model_config.init, jax.random.PRNGKey(0))
        frozen = _with_shardings(abstract_model, setup.layout.shardings(abstract_model, setup.mesh))
    platform = devices[0].platform if devices else None
    with use_layout(setup.layout, setup.mesh), compiling_for(target_backend, platform):
        lowered = setup.train_step().lower(state, batch, frozen)
        compiled = lowered.compile(compiler_options=_cpu_options(devices))
    analysis = compiled.memory_analysis()
    model: Any = setup.model_config
    int8 = getattr(model, "quantization", "none") == "int8"
    params = _bytes_per_device(state.params)
    optimizer_state = _bytes_per_device(state.opt_state)
    on_host = config.trainer.offload_optimizer_state
    # A backend that keeps host arguments apart reports them there; the CPU counts them with the rest.
    host_counted_apart = int(getattr(analysis, "host_argument_size_in_bytes", 0) or 0) > 0
    state_in_arguments = optimizer_state if on_host and not host_counted_apart else 0
    return StepMemory(
        num_devices=len(devices),
        mesh={axis: size for axis, size in mesh_axis_sizes(setup.mesh).items() if size > 1},
        model_family=type(model).family,
        remat=model.remat,
        num_params=int(model.num_params()),
        flops_per_token=float(model.flops_per_token(config.data.seq_len)),
        params=params,
        optimizer_state=optimizer_state,
        batch=_bytes_per_device(batch),
        gradients=params,
        temporaries=int(analysis.temp_size_in_bytes),
        arguments=int(analysis.argument_size_in_bytes) - state_in_arguments,
        outputs_not_aliased=max(int(analysis.output_size_in_bytes - analysis.alias_size_in_bytes), 0),
        compile_seconds=time.perf_counter() - started,
        frozen_params=_bytes_per_device(frozen) if frozen is not None else 0,
        trained_params=sum(leaf.size for leaf in jax.tree_util.tree_leaves(state.params))
        if frozen is not None
        else None,
        engine_pages=_engine_pages(config, setup) if config.trainer.objective == "grpo" else 0,
        reference_params=params if config.trainer.objective == "grpo" and config.rl.kl_beta > 0 else 0,
        optimizer_on_host=on_host,
        target_backend=target_backend,
        int8_matmuls=int8_matmuls(lowered.as_text()) if int8 else None,
        int8_flops_per_token=float(model.int8_flops_per_token()) if int8 else 0.0,
    )


CPU_PLAN_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
"""XLA options of a plan compiled on CPU devices: no YNNPACK fusions. Those run a reduction over an elementwise
expression as a library call whose constant operands (Adam's decay rates) XLA broadcasts to the whole leaf
first: float32 buffers of every parameter's shape that no accelerator's program holds."""


def _cpu_options(devices: Sequence[jax.Device]) -> dict[str, str] | None:
    return CPU_PLAN_OPTIONS if devices and devices[0].platform == "cpu" else None


def _engine_pages(config: TrainConfig, setup: RunSetup) -> int:
    """The GRPO engine's page pool on one device: ``rl.max_running`` sequences of ``data.seq_len`` tokens,
    keys and values of every layer in the compute dtype, split over the tensor axis."""
    model: Any = setup.model_config
    shape = model.shape
    pages = config.rl.max_running * -(-config.data.seq_len // config.rl.page_size)
    tokens = pages * config.rl.page_size
    tensor = mesh_axis_sizes(setup.mesh).get("tensor", 1)
    kv_heads = -(-shape.kv_heads // tensor) if shape.kv_heads % tensor == 0 else shape.kv_heads
    per_token = 2 * shape.layers * kv_heads * shape.head_size * jnp.dtype(model.compute).itemsize
    return tokens * per_token


def _with_shardings(abstract: Any, shardings: Any) -> Any:
    """``abstract``'s leaves as `jax.ShapeDtypeStruct` carrying their shardings (what `lower` takes)."""
    return jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        abstract,
        shardings,
    )


def _abstract_batch(config: TrainConfig, setup: RunSetup) -> dict[str, jax.ShapeDtypeStruct]:
    """The loader's batch as shapes: int32 ``[batch_size, seq_len + 1]`` rows split over the batch axes
    (under DPO: ``batch_size`` chosen / rejected pairs and the reference's log-probs of each; the
    reference's own forward pass, a separate program without gradients, is not part of the step; under
    DoReMi also the reference model's weights, whose forward is part of the step)."""
    axes = default_batch_axes(setup.mesh, setup.layout)
    rows = config.trainer.batch_size
    entry = None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
    sharding = NamedSharding(setup.mesh, PartitionSpec(entry, None))
    shape = (rows, config.data.seq_len + 1)
    if (
        config.trainer.objective == "grpo"
    ):  # a rollout batch: one padded row per completion, data.seq_len wide
        per_row = NamedSharding(setup.mesh, PartitionSpec(entry))
        completion = (rows, config.rl.max_new_tokens)  # per sequence (`halyard.train.rl.packing`)
        batch = {"tokens": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding)}
        batch |= {
            name: jax.ShapeDtypeStruct(completion, jnp.int32, sharding=sharding)
            for name in ("label_index", "completion_mask")
        }
        logps = ["sampler_logps"] + (
            ["old_logps"] if config.rl.updates_per_batch > 1 or config.rl.async_steps else []
        )
        logps += ["reference_logps"] if config.rl.kl_beta > 0 else []
        batch |= {name: jax.ShapeDtypeStruct(completion, jnp.float32, sharding=sharding) for name in logps}
        return batch | {"advantages": jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=per_row)}
    if config.trainer.objective == "dpo":  # pairs, with the reference's log-probs added before each step
        pairs = {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for name in PAIR_KEYS}
        per_pair = NamedSharding(setup.mesh, PartitionSpec(entry))
        return pairs | {
            name: jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=per_pair) for name in REFERENCE_KEYS
        }
    sources = mixture_sources(config.data)
    formats = {source.format for source in sources.values()} or {config.data.format}
    names = ("tokens", "segment_ids") + (("loss_mask",) if formats != {"text"} else ())
    batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for name in names}
    if sources:  # a mixture's rows say their source (the per-source loss sums)
        batch["source_one_hot"] = jax.ShapeDtypeStruct((rows, len(sources)), jnp.int32, sharding=sharding)
    if config.trainer.objective == "doremi":  # the proxy's step takes the reference's weights with the batch
        batch[REFERENCE_MODEL] = _with_shardings(*setup.abstract_trained)
    return batch


def _bytes_per_device(tree: Any) -> int:
    """Bytes of the largest shard of each leaf, summed (one device's share of the tree)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total
