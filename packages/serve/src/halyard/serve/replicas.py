"""`Replicas`: data-parallel copies of the engine, each on its own devices, behind one engine's interface.

Each replica is a whole `Engine` (its own page pool, scheduler and compiled programs) whose model lives on
its own group of devices (a mesh of ``devices_per_replica``, tensor parallel inside it when that is more than
one). A request goes to the replica with the fewest unfinished sequences and stays there; a step steps every
replica at once, each in its own thread (XLA runs them on their devices in parallel; the Python work of one
overlaps the device work of the others). With ``deterministic=True`` a request's tokens do not depend on
which replica runs it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Hashable
from collections.abc import Sequence as Seq
from typing import Any

import jax

from halyard.models import CausalLM
from halyard.serve.config import EngineConfig
from halyard.serve.engine import Engine
from halyard.serve.outputs import RequestOutput, Update, run_to_end
from halyard.serve.params import ParameterError, SamplingParams
from halyard.serve.requests import new_request_id
from halyard.serve.stats import EngineStats
from halyard.serve.text import Decode
from halyard.shard import Layout, MeshSpec


class Replicas:
    """``count`` engines over disjoint device groups, driven as one.

    Args:
        model: the model (anywhere: each replica places its own copy).
        count: the number of replicas.
        config: every replica's config.
        devices_per_replica: devices of one replica; more than one runs it tensor parallel.
        devices: the devices to use (default all), at least ``count * devices_per_replica``.
        decode, eos_token_ids: as for `Engine`.

    Raises:
        ValueError: too few devices.
    """

    def __init__(
        self,
        model: CausalLM,
        count: int,
        config: EngineConfig | None = None,
        *,
        devices_per_replica: int = 1,
        devices: Seq[Any] | None = None,
        decode: Decode | None = None,
        eos_token_ids: Seq[int] | None = None,
    ):
        devices = list(jax.devices() if devices is None else devices)
        if count < 1 or devices_per_replica < 1 or count * devices_per_replica > len(devices):
            raise ValueError(
                f"Replicas: {count} replicas of {devices_per_replica} devices need {count * devices_per_replica} "
                f"devices, {len(devices)} are available"
            )
        layout = Layout.tensor_parallel(min_shard=1)
        self.engines: list[Engine] = []
        for index in range(count):
            group = devices[index * devices_per_replica : (index + 1) * devices_per_replica]
            mesh = MeshSpec(data=1, tensor=devices_per_replica).build(group)
            placed = jax.device_put(model, layout.shardings(model, mesh))
            self.engines.append(
                Engine(placed, config, decode=decode, eos_token_ids=eos_token_ids, mesh=mesh, layout=layout)
            )
        self._owner: dict[str, Engine] = {}
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=count, thread_name_prefix="replica")

    @property
    def config(self) -> EngineConfig:
        return self.engines[0].config

    @property
    def max_context(self) -> int:
        return self.engines[0].max_context

    def add_request(
        self,
        prompt: Seq[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        caller: Hashable = None,
    ) -> str:
        """Queue a request on the least busy replica (see `Engine.add_request`)."""
        if request_id is not None and request_id in self._owner:
            raise ParameterError("request_id", f"request_id: {request_id!r} is already running")
        engine = min(self.engines, key=lambda e: len(e.sequences()))
        request_id = new_request_id() if request_id is None else request_id
        engine.add_request(prompt, params, request_id, caller=caller)
        self._owner[request_id] = engine
        return request_id

    def cancel(self, request_id: str) -> None:
        """End a request now (see `Engine.cancel`)."""
        engine = self._owner.pop(request_id, None)
        if engine is not None:
            engine.cancel(request_id)

    def stop_sample(self, request_id: str, index: int, stop_string: str) -> None:
        """End one sample at a stop string (see `Engine.stop_sample`)."""
        engine = self._owner.get(request_id)
        if engine is not None:
            engine.stop_sample(request_id, index, stop_string)

    def hand_off_text(self) -> Decode | None:
        """Leave the text to the caller (see `Engine.hand_off_text`)."""
        decodes = [engine.hand_off_text() for engine in self.engines]
        return decodes[0]

    @property
    def has_work(self) -> bool:
        return any(engine.has_work for engine in self.engines)

    def step(self) -> list[Update]:
        """One step of every replica with work, in parallel."""
        busy = [engine for engine in self.engines if engine.has_work]
        updates: list[Update] = []
        for result in self._threads.map(lambda engine: engine.step(), busy):
            updates += result
        for update in updates:
            engine = self._owner.get(update.request_id)
            if engine is not None and not engine.knows(update.request_id):
                del self._owner[update.request_id]  # finished
        return updates

    @property
    def stats(self) -> EngineStats:
        """The replicas' counters and gauges added up (``tokens_per_second`` too)."""
        return EngineStats.combined([engine.stats for engine in self.engines])

    def generate(
        self, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams]
    ) -> list[RequestOutput]:
        """Run ``prompts`` to the end over the replicas (see `Engine.generate`)."""
        return run_to_end(self, prompts, params)

    def close(self) -> None:
        """Stop the replicas' threads."""
        self._threads.shutdown(wait=True)
