"""The GRPO loop: sample -> score -> train, ``rl.updates_per_batch`` optimizer steps per batch of rollouts.

Step ``s`` (0-based) trains on rollout batch ``s // rl.updates_per_batch``; a batch is sampled when its first
step comes (or again, identically, when a resumed run starts inside it). Rollout batch ``r`` reads the prompts
at positions ``r * prompts_per_step ...`` of the run's order (more with dynamic sampling, which draws whole
extra rounds at the following positions of a separate stream) and samples with seeds of ``(trainer.seed, r,
position)``: with the engine's deterministic mode a resumed run repeats the uninterrupted one bit for bit.
With ``rl.async_steps K`` the batch of step ``s`` is sampled with the weights the state had ``K`` batches
earlier (kept in memory), and importance sampling corrects for them.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.serve import SamplingParams
from halyard.shard import batch_share, global_batch_from_local, is_main_process
from halyard.train.rl.batch import ScoredGroups, batch_arrays, rollout_metrics, row_metrics, score_groups
from halyard.train.rl.rollouts import Group
from halyard.train.rl.session import RlSession
from halyard.train.step import TrainState
from halyard.train.trainer.interruption import before_steps, signalled_on_any_process, stop_run

ROW_ARRAYS = ("tokens", "segment_ids", "positions", "label_index")
"""What the old policy's and the reference's log-probs are computed from."""
DYNAMIC_POSITION_OFFSET = 1 << 40
"""Dynamic sampling's extra prompts come from positions this far into the order (a stream of their own)."""


class GrpoLoop:
    """Runs the steps of an `RlSession`.

    Args:
        session: the started run.
        preemption: the flag polled every step.
        folder: the run folder (kept once a step ran).
    """

    def __init__(self, session: RlSession, preemption: Any, folder: Any):
        self.session = session
        self.preemption = preemption
        self.folder = folder
        config = session.setup.config
        self.rl = config.rl
        self.steps = config.trainer.steps
        self.prompts_per_step = config.trainer.batch_size // self.rl.group_size
        self._batch: tuple[int, dict[str, Any], dict[str, float]] | None = None
        self._stale: deque[Any] = deque(maxlen=self.rl.async_steps + 1)

    def run(self) -> TrainState:
        """Steps from the session's start to ``trainer.steps``; returns the last state."""
        session, log = self.session, self.session.log
        state = session.state
        if signalled_on_any_process(self.preemption):
            log.close(quiet=True)
            stop_run(self.preemption, before_steps(session.start_step), main=is_main_process())
        if session.start_step == 0:
            self._evaluate(0, state)  # where the run starts from
        for step in range(session.start_step, self.steps):
            rollout = step // self.rl.updates_per_batch
            # sampling (and, at first, the engine compiling its programs) is no wait for data
            with log.rollout_timer(lambda: session.rollouts.engine.stats.compile_seconds):
                arrays, metrics = self._rollout_batch(rollout, state)
            batch = self._device_batch(arrays, state)
            log.before_step()
            state, step_metrics = session.step_for(step + 1)(state, batch, session.frozen)
            step_metrics = {**step_metrics, **{name: np.float32(value) for name, value in metrics.items()}}
            log.after_step(step + 1, step_metrics, tokens=int(arrays["completion_mask"].sum()))
            self.folder.keep()
            self._evaluate(step + 1, state)
            if self.preemption.requested_on_any_process():
                session.save(step + 1, state, wait=True)
                log.close()
                stop_run(
                    self.preemption,
                    f"at step {step + 1}; checkpoint saved; run the same command to resume",
                    main=is_main_process(),
                )
            session.save(step + 1, state, only_when_due=True)
        return state

    # -- rollouts ----------------------------------------------------------------------------------
    def _rollout_batch(self, rollout: int, state: TrainState) -> tuple[dict[str, Any], dict[str, float]]:
        if self._batch is not None and self._batch[0] == rollout:
            return self._batch[1], {}  # the same rollouts again (rl.updates_per_batch)
        session = self.session
        self._stale.append(_snapshot(session.model(state)) if self.rl.async_steps else session.model(state))
        weights = self._stale[0]
        started = time.perf_counter()
        sampled = session.rollouts.sample(
            rollout, rollout * self.prompts_per_step, self.prompts_per_step, weights
        )
        scored = score_groups(sampled.groups, session.rewards, self.rl)
        handover, sampling, generated = (
            sampled.handover_seconds,
            sampled.sampling_seconds,
            sampled.generated_tokens,
        )
        if self.rl.dynamic_sampling:
            scored, extra = self._fill(rollout, scored, weights)
            handover, sampling, generated = handover + extra[0], sampling + extra[1], generated + extra[2]
        arrays = batch_arrays(scored, session.rows)
        models = []
        if self.rl.updates_per_batch > 1 or self.rl.async_steps:
            models.append(("old_logps", session.model(state)))
        if session.reference is not None:
            models.append(("reference_logps", session.reference))
        if models:  # the old policy's and the reference's log-probs in one program
            rows = {name: self._replicated(arrays[name]) for name in ROW_ARRAYS if name in arrays}
            computed = session.logprobs(tuple(model for _, model in models), rows)
            arrays.update(
                {name: np.asarray(value) for (name, _), value in zip(models, computed, strict=True)}
            )
        metrics = rollout_metrics(scored, self.rl)
        metrics.update(row_metrics(arrays, scored))
        metrics.update(
            {
                "rollout/handover_seconds": handover,
                "rollout/sampling_seconds": sampling,
                "rollout/tokens_per_second": generated / max(sampling, 1e-9),
                "rollout/seconds": time.perf_counter() - started,
                "rollout/staleness": float(len(self._stale) - 1),
            }
        )
        self._batch = (rollout, arrays, metrics)
        return arrays, metrics

    def _fill(
        self, rollout: int, scored: ScoredGroups, weights: Any
    ) -> tuple[ScoredGroups, tuple[float, float, int]]:
        """DAPO's dynamic sampling: keep the groups with an advantage, draw more rounds of prompts until the
        batch is full or ``rl.dynamic_sampling_tries`` rounds were drawn; fill up with groups without one."""
        session = self.session
        kept = [i for i, equal in enumerate(scored.all_equal) if not equal]
        pool: list[tuple[ScoredGroups, int]] = [(scored, i) for i in kept]
        spare: list[tuple[ScoredGroups, int]] = [
            (scored, i) for i, equal in enumerate(scored.all_equal) if equal
        ]
        seconds = [0.0, 0.0, 0]
        for attempt in range(self.rl.dynamic_sampling_tries):
            if len(pool) >= self.prompts_per_step:
                break
            position = (
                DYNAMIC_POSITION_OFFSET
                + (rollout * self.rl.dynamic_sampling_tries + attempt) * self.prompts_per_step
            )
            more = session.rollouts.sample(rollout, position, self.prompts_per_step, weights)
            seconds[0] += more.handover_seconds
            seconds[1] += more.sampling_seconds
            seconds[2] += more.generated_tokens
            extra = score_groups(more.groups, session.rewards, self.rl)
            pool += [(extra, i) for i, equal in enumerate(extra.all_equal) if not equal]
            spare += [(extra, i) for i, equal in enumerate(extra.all_equal) if equal]
        chosen = (pool + spare)[: self.prompts_per_step]
        return _merge(chosen), (seconds[0], seconds[1], int(seconds[2]))

    def _replicated(self, value: np.ndarray) -> jax.Array:
        """``value`` (the same on every process) whole on every device of the mesh."""
        mesh = self.session.setup.mesh
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return jax.make_array_from_process_local_data(replicated, value)

    def _device_batch(self, arrays: dict[str, Any], state: TrainState) -> dict[str, jax.Array]:
        setup = self.session.setup
        index, count = batch_share(setup.mesh, setup.layout)
        # rows and per-sequence arrays differ in length: each splits into the processes' equal slices
        local = {
            name: np.split(value, count)[index] if count > 1 else value for name, value in arrays.items()
        }
        return global_batch_from_local(local, setup.mesh, layout=setup.layout)

    # -- evaluation --------------------------------------------------------------------------------
    def _evaluate(self, step: int, state: TrainState) -> None:
        """Every ``trainer.eval_every`` steps and at the last: the greedy mean reward on the held-out prompts."""
        held = self.session.held_out
        every = self.session.setup.config.trainer.eval_every
        if held is None or not every or (step % every and step != self.steps and step != 0):
            return
        started = time.perf_counter()
        reward = held_out_reward(self.session, state)
        self.session.log.record_eval(step, {"eval/reward_mean": reward}, time.perf_counter() - started)


def held_out_reward(session: RlSession, state: TrainState) -> float:
    """The mean reward of greedy completions of every held-out prompt with ``state``'s weights."""
    held = session.held_out
    assert held is not None
    engine = session.rollouts.engine
    engine.update_weights(session.model(state))
    prompts = held.prompts
    params = SamplingParams(max_tokens=session.setup.config.rl.max_new_tokens, temperature=0.0)
    outputs = engine.generate([list(p.tokens) for p in prompts], params)
    scores = session.rewards.score(
        [p.text for p in prompts],
        [o.samples[0].text for o in outputs],
        [p.answer for p in prompts],
        [p.where for p in prompts],
    )
    return float(np.nanmean(np.nan_to_num(scores.total, nan=0.0)))


def _snapshot(model: Any) -> Any:
    """A copy of ``model``'s arrays (the state is donated to the next step; stale weights must outlive it)."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x, model)


def _merge(chosen: list[tuple[ScoredGroups, int]]) -> ScoredGroups:
    groups: list[Group] = [scored.groups[i] for scored, i in chosen]
    names = list(chosen[0][0].per_function)
    return ScoredGroups(
        groups,
        np.stack([scored.rewards[i] for scored, i in chosen]),
        {name: np.stack([scored.per_function[name][i] for scored, i in chosen]) for name in names},
        np.stack([scored.advantages[i] for scored, i in chosen]),
        np.asarray([scored.all_equal[i] for scored, i in chosen]),
    )
