"""Preflight checks of the parallelism that splits more than the batch: a sequence split over
``trainer.mesh.sequence`` (context parallelism) and a layer stack pipelined over ``trainer.mesh.stage``."""

from __future__ import annotations

import math
from typing import Any

from halyard.models.decoder.pipeline import layer_pattern_period
from halyard.named import Axis
from halyard.shard import default_batch_axes, mesh_axis_sizes
from halyard.train.config.errors import ConfigError
from halyard.train.run_config import TrainConfig


def check_context_parallel(config: TrainConfig, model_config: Any, mesh: Any, layout: Any) -> None:
    """A sequence split over ``trainer.mesh.sequence`` devices: the length cuts into the 2N load-balanced
    chunks, and ``ulysses`` finds heads that divide."""
    sizes = mesh_axis_sizes(mesh)
    parts = sizes.get("sequence", 1)
    if parts < 2:
        return
    if config.data.seq_len % (2 * parts):
        raise ConfigError(
            f"data.seq_len={config.data.seq_len} does not cut into the 2 x trainer.mesh.sequence = {2 * parts} "
            f"equal chunks of load-balanced context parallelism; use a multiple of {2 * parts}"
        )
    if getattr(model_config, "context_parallel", None) != "ulysses":
        return
    heads, kv_heads = model_config.shape.heads, model_config.shape.kv_heads
    # how the layout splits the heads of an activation whose positions are split (not of a weight)
    activation = (Axis("batch", 1), Axis("pos", config.data.seq_len), Axis("heads", heads))
    head_split = math.prod(
        sizes[a]
        for dim in layout.placement(activation, mesh)
        if dim.axis.name == "heads"
        for a in dim.mesh_axes
    )
    per_device = (heads // head_split, kv_heads // head_split)
    if heads % head_split or kv_heads % head_split or per_device[0] % parts or per_device[1] % parts:
        raise ConfigError(
            f"model.context_parallel=ulysses needs the heads ({heads}) and kv heads ({kv_heads}) of each of the "
            f"{head_split} tensor shards to divide by trainer.mesh.sequence={parts}; use all_gather or ring"
        )


def check_pipeline(config: TrainConfig, model_config: Any, mesh: Any, layout: Any) -> None:
    """A layer stack pipelined over ``trainer.mesh.stage`` = S stages: the layers cut into S x
    ``model.pipeline_repeats`` equal pieces (whole periods of a layer pattern), at least S microbatches,
    and each accumulation step's rows cut into microbatches that split over the batch devices."""
    sizes = mesh_axis_sizes(mesh)
    stages = sizes.get("stage", 1)
    if stages < 2:
        return
    repeats, microbatches = model_config.pipeline_repeats, model_config.pipeline_microbatches
    layers = model_config.shape.layers
    if layers % (stages * repeats):
        raise ConfigError(
            f"model.num_layers={layers} does not cut into trainer.mesh.stage={stages} x "
            f"model.pipeline_repeats={repeats} equal pieces; choose a stage count and repeats whose product "
            f"divides {layers}"
        )
    period = layer_pattern_period(
        model_config.layer_kinds() if hasattr(model_config, "layer_kinds") else None
    )
    if (layers // (stages * repeats)) % period:
        raise ConfigError(
            f"trainer.mesh.stage={stages} x model.pipeline_repeats={repeats} gives pieces of "
            f"{layers // (stages * repeats)} layers, which do not hold whole periods of the model's "
            f"{period}-layer pattern; choose pieces of a multiple of {period} layers"
        )
    if microbatches < stages:
        raise ConfigError(
            f"model.pipeline_microbatches={microbatches} is fewer than the trainer.mesh.stage={stages} stages; "
            f"a pipeline needs a microbatch per stage at least: use {stages} or more"
        )
    shards = math.prod(sizes[axis] for axis in default_batch_axes(mesh, layout))
    rows = config.trainer.batch_size // config.trainer.accumulation
    if rows % (microbatches * shards):
        raise ConfigError(
            f"trainer.batch_size={config.trainer.batch_size} gives {rows} rows a step (accumulation "
            f"{config.trainer.accumulation}), which do not cut into model.pipeline_microbatches={microbatches} "
            f"microbatches split over {shards} batch devices; use a batch size that is a multiple of "
            f"{microbatches * shards * config.trainer.accumulation}"
        )
