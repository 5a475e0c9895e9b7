"""`RlSession`: what a GRPO run starts before its first step (prompts, state, reference, engine, step, log)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from halyard.data import TokenizerSpec, load_tokenizer
from halyard.models.attention.dispatch import default_block_size
from halyard.serve.requests import eos_ids_of
from halyard.shard import default_batch_axes, is_main_process
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.policies import KeepPolicy, SavePolicy
from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import save_resolved_config
from halyard.train.corpora.max_digit import PROMPT_CORPORA, write_max_digit_prompts
from halyard.train.data_assembly.data_section import hf_tokenizer_folder, work_dir_of
from halyard.train.lora.adapters import with_base
from halyard.train.lora.base import checkpoint_metadata
from halyard.train.perf.goodput import Goodput
from halyard.train.rl.objective import policy_logprobs
from halyard.train.rl.packing import RowLayout, alignment
from halyard.train.rl.prompts import PromptSet
from halyard.train.rl.rewards.scoring import RewardSet, load_rewards
from halyard.train.rl.rollouts import Rollouts
from halyard.train.run.setup import RunSetup
from halyard.train.run.sources import load_lora_base
from halyard.train.run.unfused import fused_multiply_add_note
from halyard.train.step import TrainState
from halyard.train.trainer.initial_state import initial_state
from halyard.train.trainer.metrics_log import MetricsLog
from halyard.train.trainer.out_of_memory import out_of_memory_advice

CONTEXT_MULTIPLE = 64
"""The trained sequences' width is rounded up to a multiple of this (the attention kernel's block)."""


@dataclass
class RlSession:
    """The started pieces of one GRPO run.

    Attributes:
        setup: the run's derived values (mesh, layout, optimizer, abstract state, step).
        prompts: the run's prompts and their order; held_out: the evaluation prompts, or None.
        rewards: the reward functions.
        manager: the checkpoint manager.
        state: the state the first step starts from; frozen: a LoRA run's frozen base, else None.
        reference: the frozen initial weights (with ``rl.kl_beta``), else None.
        logprobs: the jitted ``(model, tokens) -> logps`` of the old policy and the reference.
        rollouts: the engine and its sampling.
        step_fn: the jitted train step.
        watched_step_fn: the jitted step of ``trainer.watch`` (the same update, with its statistics), built at
            the first step it runs.
        log: metrics and trackers.
        metadata: what each checkpoint records besides the state.
        width: the tokens of a padded row (the longest prompt, ``rl.max_new_tokens``, the label shift).
        rows: how the step's sequences become rows (packed, or one to a padded row).
        start_step: the step the state is at.
    """

    setup: RunSetup
    prompts: PromptSet
    held_out: PromptSet | None
    rewards: RewardSet
    manager: CheckpointManager
    state: TrainState
    frozen: Any
    reference: Any
    logprobs: Callable[..., Any]
    rollouts: Rollouts
    step_fn: Callable[..., Any]
    log: MetricsLog
    metadata: dict[str, Any]
    width: int
    rows: RowLayout
    start_step: int
    watched_step_fn: Callable[..., Any] | None = None

    def step_for(self, step: int) -> Callable[..., Any]:
        """The compiled step that runs step ``step`` (1-based): the watched one where ``trainer.watch`` says."""
        if not self.setup.config.trainer.watch.watches(step):
            return self.step_fn
        if self.watched_step_fn is None:
            self.watched_step_fn = self.setup.train_step(watched=True)
        return self.watched_step_fn

    def model(self, state: TrainState) -> Any:
        """The whole model of ``state`` (a LoRA run's base joined with its adapters)."""
        return with_base(state, self.frozen).params

    def save(self, step: int, state: TrainState, *, only_when_due: bool = False, wait: bool = False) -> None:
        """Save a checkpoint of ``state`` (with ``only_when_due``: if the save policy wants one now)."""
        with self.log.checkpoint_timer():
            if only_when_due:
                self.manager.maybe_save(step, state, self.metadata)
            else:
                self.manager.save(step, state, self.metadata, wait=wait)

    def close(self) -> None:
        self.manager.close()


def prompt_sources(config: Any, run_dir: Path) -> tuple[list[str], str]:
    """The prompt files and the tokenizer: ``data.sources`` and ``data.tokenizer`` (or ``trainer.init``'s
    folder), or a built-in prompt corpus written into the run's data folder.

    Raises:
        ConfigError: an unknown built-in corpus, no sources, or no tokenizer.
    """
    data = config.data
    if data.builtin_corpus is not None:
        if data.builtin_corpus not in PROMPT_CORPORA:
            raise ConfigError(
                f"data.builtin_corpus={data.builtin_corpus!r} with data.format=prompts: known prompt corpora "
                f"are {', '.join(PROMPT_CORPORA)}"
            )
        prompts, tokenizer = write_max_digit_prompts(
            work_dir_of(data, run_dir) / "corpus" / data.builtin_corpus
        )
        return [str(prompts)], data.tokenizer or str(tokenizer)
    if not data.sources:
        raise ConfigError(
            "data.sources is empty: give the prompt records' files (jsonl, json, parquet, arrow)"
        )
    named = data.tokenizer or hf_tokenizer_folder(config.trainer.init)
    if named is None:
        raise ConfigError(
            "data.tokenizer is not set: give a tokenizer.json or folder (or trainer.init: hf:FOLDER)"
        )
    return list(data.sources), named


def context_width(config: Any, model_config: Any, longest_prompt: int) -> int:
    """The trained sequences' width: the longest prompt plus ``rl.max_new_tokens`` plus the label shift,
    rounded up to `CONTEXT_MULTIPLE` but within the model's positions."""
    needed = longest_prompt + config.rl.max_new_tokens
    rounded = -(-needed // CONTEXT_MULTIPLE) * CONTEXT_MULTIPLE
    limit = model_config.shape.max_position
    return min(rounded, limit) + 1


def row_layout(setup: RunSetup, width: int) -> RowLayout:
    """How the run's sequences become rows: packed into rows of ``rl.pack_width`` tokens, unless ``rl.pack``
    is off, the alignment ``rl.deterministic`` needs leaves nothing to pack (a sequence would take a whole
    padded row's tokens anyway), or ``trainer.invariant`` cuts each microbatch's rows into slices.

    Raises:
        ConfigError: ``rl.pack_width`` below the longest sequence.
    """
    config = setup.config
    rl = config.rl
    block = setup.model_config.attention_block_size or default_block_size()
    align = alignment(rl.deterministic, rl.page_size, block)
    longest = width - 1
    shards = math.prod(setup.mesh.shape[axis] for axis in default_batch_axes(setup.mesh, setup.layout))
    common = dict(
        longest=longest, completion_tokens=rl.max_new_tokens, microbatches=config.trainer.accumulation
    )
    if not rl.pack or align >= longest or config.trainer.invariant:  # its slices cut rows: one sequence each
        return RowLayout(width, packed=False, **common)  # type: ignore[arg-type]
    if rl.pack_width < longest:
        raise ConfigError(
            f"rl.pack_width={rl.pack_width} is below the longest sequence ({longest} tokens: the longest "
            f"prompt and rl.max_new_tokens, rounded up to {CONTEXT_MULTIPLE}); raise it"
        )
    return RowLayout(rl.pack_width + 1, align=align, row_multiple=shards, **common)  # type: ignore[arg-type]


def start_rl_session(
    setup: RunSetup, run_dir: Path, goodput: Goodput, clock: Callable[[], float]
) -> RlSession:
    """Everything up to the first GRPO step (see `RlSession`).

    Raises:
        ConfigError: bad prompt records, sources or rewards (one line each).
    """
    config = setup.config
    rl = config.rl
    if rl.deterministic:
        note = fused_multiply_add_note(
            "rl.deterministic", "the sampler's and the trainer's log-probabilities agree to rounding only"
        )
        if note is not None and is_main_process():
            print(note, flush=True)
    rewards = load_rewards(rl.rewards, rl.weights)
    tokenizer, prompts, held_out, width = _prompts(setup, run_dir)
    manager = CheckpointManager(
        run_dir / "checkpoints",
        save_policy=SavePolicy(config.checkpoint.every_steps, config.checkpoint.every_seconds),
        keep_policy=KeepPolicy(config.checkpoint.keep_last, config.checkpoint.keep_every_steps),
        clock=clock,
        verify_checksums=config.checkpoint.verify_checksums,
    )
    data_position = {
        "manifest": {"prompts": _fingerprint(prompts)},
        "batch_size": config.trainer.batch_size,
        "trainer_seed": config.trainer.seed,
    }
    with out_of_memory_advice(config, "creating the training state"):
        base = load_lora_base(config, setup.model_config, setup.layout, setup.mesh, manager)
        frozen = base.params if base is not None else None
        state = initial_state(setup, manager, data_position)
        reference = (
            (frozen if frozen is not None else setup.initial_model(manager)) if rl.kl_beta > 0 else None
        )
    if is_main_process():
        save_resolved_config(config, run_dir)
    model = with_base(state, frozen).params
    rollouts = Rollouts(
        model,
        rl,
        prompts,
        context=width - 1,
        decode=lambda ids: tokenizer.build().decode(list(ids), skip_special_tokens=True),
        eos_token_ids=_eos_ids(tokenizer, setup.model_config),
        seed=config.trainer.seed,
        mesh=setup.mesh,
        layout=setup.layout,
    )
    start_step = int(state.step)
    log = MetricsLog(
        config,
        run_dir,
        setup.mesh,
        start_step=start_step,
        model_config=setup.model_config,
        goodput=goodput,
        clock=clock,
    )
    return RlSession(
        setup=setup,
        prompts=prompts,
        held_out=held_out,
        rewards=rewards,
        manager=manager,
        state=state,
        frozen=frozen,
        reference=reference,
        logprobs=jax.jit(policy_logprobs(rl, config.trainer.accumulation)),
        rollouts=rollouts,
        step_fn=setup.train_step(),
        log=log,
        metadata={"data": data_position, **checkpoint_metadata(base), **setup.checkpoint_metadata()},
        width=width,
        rows=row_layout(setup, width),
        start_step=start_step,
    )


def _prompts(setup: RunSetup, run_dir: Path) -> tuple[TokenizerSpec, PromptSet, PromptSet | None, int]:
    """The tokenizer, the training and held-out prompts, and the trained sequences' width.

    Raises:
        ConfigError: a batch that does not hold whole groups, no room for a prompt, bad records.
    """
    config = setup.config
    rl = config.rl
    if config.trainer.batch_size % rl.group_size:
        raise ConfigError(
            f"trainer.batch_size={config.trainer.batch_size} counts completions: make it a multiple of "
            f"rl.group_size={rl.group_size}"
        )
    sources, tokenizer_path = prompt_sources(config, run_dir)
    tokenizer = load_tokenizer(tokenizer_path)
    room = setup.model_config.shape.max_position - rl.max_new_tokens
    if room < 1:
        raise ConfigError(
            f"rl.max_new_tokens={rl.max_new_tokens} leaves no room for a prompt in the model's "
            f"{setup.model_config.shape.max_position} positions"
        )
    data = dataclasses.replace(config.data, sources=sources)
    everything = PromptSet.load(data, tokenizer, max_prompt_tokens=room)
    prompts, held_out = _split(everything, config.data.validation_fraction)
    width = context_width(config, setup.model_config, max(len(p.tokens) for p in everything.prompts))
    return tokenizer, prompts, held_out, width


def _split(prompts: PromptSet, fraction: float) -> tuple[PromptSet, PromptSet | None]:
    """The training prompts and the held-out ones (``data.validation_fraction`` of the records, chosen by
    ``data.seed``), or all and None."""
    count = round(len(prompts) * fraction)
    if count == 0:
        return prompts, None
    held = {index for index, _ in PromptSet(prompts.prompts, prompts.seed + 1).batch(0, count)}
    training = [p for i, p in enumerate(prompts.prompts) if i not in held]
    evaluation = [p for i, p in enumerate(prompts.prompts) if i in held]
    if not training:
        raise ConfigError(f"data.validation_fraction={fraction} leaves no training prompt")
    return PromptSet(training, prompts.seed), PromptSet(evaluation, prompts.seed)


def _fingerprint(prompts: PromptSet) -> dict[str, Any]:
    digest = hashlib.sha256()
    for prompt in prompts.prompts:
        digest.update(repr((prompt.tokens, prompt.answer)).encode())
    return {"records": len(prompts), "sha256": digest.hexdigest(), "seed": prompts.seed}


def _eos_ids(tokenizer: TokenizerSpec, model_config: Any) -> tuple[int, ...]:
    """The model config's EOS ids, then the tokenizer's (``<|endoftext|>`` when it names none)."""
    eos = tokenizer.eos_token if tokenizer.eos_token is not None else "<|endoftext|>"
    return eos_ids_of(model_config, tokenizer.build().token_to_id(eos))
