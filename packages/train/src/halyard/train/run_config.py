"""The run config: one frozen dataclass tree that is the YAML schema, the command line and the docs.

``train --config demo --trainer.steps 200`` reads the built-in ``demo`` config, then applies the override.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from halyard.data.examples.formats import CHAT_TEMPLATES, EXAMPLE_KINDS
from halyard.models import ModelConfig, model_config
from halyard.models.lora import LoraConfig
from halyard.shard import MeshSpec
from halyard.train.doremi.config import DoremiConfig, check_doremi_run
from halyard.train.eval_config import EvalConfig
from halyard.train.mixture.config import MixtureConfig, block_rows, check_mixture
from halyard.train.objectives.config import OBJECTIVES, DpoConfig, check_objective_data
from halyard.train.optim.config import AdamWConfig, OptimizerConfig
from halyard.train.rl.config import RlConfig
from halyard.train.trackers.config import JsonlTrackerConfig, TrackerConfig
from halyard.train.watch.config import SpikeConfig, WatchConfig

INIT_MODES = ("auto", "scratch", "resume")
INIT_PREFIXES = ("checkpoint:", "weights:", "hf:")


@dataclass(frozen=True)
class DataConfig:
    """Where the tokens come from and how they are cut into sequences."""

    sources: list[str] = field(default_factory=list)
    """Raw text shards: paths or URLs with globs/braces (jsonl, json, txt, parquet, .gz/.zst)."""
    builtin_corpus: str | None = None
    """A corpus present on every machine instead of `sources`: `python-stdlib` (the standard library's .py files), `english-prose` (Python's reference documentation's paragraphs), `repetitive` (the alphabet over and over) or `noise` (random binary digits)."""
    tokenizer: str | None = None
    """A tokenizer.json file or tokenizer folder, or `bytes` (a token per byte, shipped); with `builtin_corpus` and no tokenizer, a BPE tokenizer is trained on the corpus."""
    tokenizer_vocab_size: int = 4096
    """Vocabulary size of the tokenizer trained for a `builtin_corpus`."""
    cache_dir: str | None = None
    """Folder of the run's data files (default: <run_dir>/cache): the token cache in <cache_dir>/tokens (`halyard cache info` reads either folder), and a builtin_corpus's files and tokenizer. A cache built with other data or another tokenizer is refused."""
    text_field: str = "text"
    """JSON key / parquet column holding the text."""
    seq_len: int = 256
    """Tokens per training sequence."""
    shuffle: str = "feistel"
    """Example order: feistel (whole-cache permutation: step 1 waits for the whole cache build), era (a permutation inside each era of era_windows sequences: training starts when the first era is tokenized, while the build goes on) or none (stream order)."""
    era_windows: int = 4096
    """shuffle=era: sequences per era (training starts when the first era's tokens are built)."""
    seed: int = 0
    """Chooses the shuffle and the validation windows."""
    validation_fraction: float = 0.0
    """Share of windows held out for validation (0 disables periodic evaluation)."""
    max_documents: int | None = None
    """Use at most this many documents of a `builtin_corpus` (smoke runs)."""
    num_workers: int | None = None
    """Tokenizer processes for the cache build on each host (default: the machine's cores; 0: in the trainer's process)."""
    builder: str = "local"
    """Who tokenizes, in the background while training runs: local (every host a share of the shards, with a process pool) or ray (process 0 sends the shards to a Ray cluster as tasks)."""
    ray_address: str | None = None
    """builder=ray: the cluster (auto, or ray://host:10001); null starts a local Ray with num_workers CPUs."""
    format: str = "text"
    """What each record holds: text (a document; every token is trained on), chat (a list of {role, content} messages, roles system/user/assistant; only the assistant turns are trained on), prompt_completion (only the completion is trained on), preference (a prompt with a chosen and a rejected reply, for trainer.objective=dpo; only the replies count) or prompts (a prompt and its reference answer, for trainer.objective=grpo: the model samples completions that rewards score; read from jsonl, json, parquet or arrow, not cached). All but text and prompts read jsonl/json sources and store a loss mask in the cache."""
    messages_field: str = "messages"
    """format=chat: the key of the message list."""
    role_field: str = "role"
    """format=chat: the key of a message's role."""
    content_field: str = "content"
    """format=chat: the key of a message's text."""
    prompt_field: str = "prompt"
    """format=prompt_completion or preference: the key of the prompt (for preference a string, one user message, or a list of messages)."""
    answer_field: str = "answer"
    """format=prompts: the key of the reference answer the rewards compare a completion with."""
    completion_field: str = "completion"
    """format=prompt_completion: the key of the completion (appended to the prompt as it is)."""
    chosen_field: str = "chosen"
    """format=preference: the key of the preferred reply (a string, one assistant message, or a list of assistant messages)."""
    rejected_field: str = "rejected"
    """format=preference: the key of the dispreferred reply (like chosen_field)."""
    chat_template: str = "simple"
    """format=chat or preference: simple (each message is <marker of its role><content><end_of_turn>; the assistant's content and end_of_turn are targets), tokenizer (the chat_template of the tokenizer folder's tokenizer_config.json or chat_template.jinja) or auto (the tokenizer's when it has one, else simple)."""
    system_marker: str = "<|system|>\n"
    """chat_template=simple: text before a system message (default: <|system|> and a newline)."""
    user_marker: str = "<|user|>\n"
    """chat_template=simple: text before a user message (default: <|user|> and a newline)."""
    assistant_marker: str = "<|assistant|>\n"
    """chat_template=simple: text before an assistant message (default: <|assistant|> and a newline)."""
    end_of_turn: str = "\n"
    """chat_template=simple: text after every message (default: a newline)."""
    strict: bool = False
    """Stop the cache build at the first bad record (malformed JSON, unknown role, chat without an assistant turn), naming file:line; false skips it and counts it in the cache ledger."""
    mixture: MixtureConfig = field(default_factory=MixtureConfig)
    """Train on several named sources at once, each with its own cache, in set proportions that may change by step (see data.mixture.*); no sources: data.sources is the one source."""
    allow_mixture_change: bool = False
    """Resume a run although data.mixture.weights or schedule changed since its checkpoint: from the resumed step on, the batches are the new mixture's at those steps (a source whose share grew skips ahead in its order, one whose share shrank sees some rows again); false refuses, naming what changed."""

    def __post_init__(self) -> None:
        if self.builder not in ("local", "ray"):
            raise ValueError(f"data.builder={self.builder!r}: use local or ray")
        if self.era_windows < 1:
            raise ValueError(f"data.era_windows={self.era_windows}: must be at least 1")
        if self.format not in (*EXAMPLE_KINDS, "prompts"):
            raise ValueError(
                f"data.format={self.format!r}: use one of {', '.join((*EXAMPLE_KINDS, 'prompts'))}"
            )
        if self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(
                f"data.chat_template={self.chat_template!r}: use one of {', '.join(CHAT_TEMPLATES)}"
            )
        if self.format not in ("text", "prompts") and self.builtin_corpus is not None:
            raise ValueError(
                f"data.format={self.format!r} needs data.sources of jsonl/json examples; "
                "data.builtin_corpus is plain text (use data.format=text)"
            )
        check_mixture(self)


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written and which are kept."""

    every_steps: int | None = 1000
    """Save at multiples of this step (null: no step-based saves)."""
    every_seconds: float | None = 1800.0
    """Save when this many seconds passed since the last save (null: no time-based saves)."""
    keep_last: int = 2
    """Newest complete checkpoints kept (the last complete one is never deleted)."""
    keep_every_steps: int | None = None
    """Keep forever every checkpoint at a multiple of this step."""
    on_write_error: str = "stop"
    """When writing a checkpoint fails (disk full, permission denied): stop (exit 1 with the error; the previous checkpoint stays intact) or retry (report it, keep training, save again at the next checkpoint)."""
    verify_checksums: bool = True
    """Before restoring, check every file against the checksum recorded at save time (one extra read of the checkpoint): resuming skips a damaged checkpoint for the previous one; an explicit checkpoint: path fails naming the file. false loads damaged data without noticing."""

    def __post_init__(self) -> None:
        if self.on_write_error not in ("stop", "retry"):
            raise ValueError(f"checkpoint.on_write_error={self.on_write_error!r}: use stop or retry")


@dataclass(frozen=True)
class TrainerConfig:
    """The training loop."""

    run_dir: str = "runs/default"
    """Run directory: resolved config, checkpoints, metrics, tracker files."""
    steps: int = 1000
    """The final step: a resumed run continues to it."""
    continue_schedule: str = "hold"
    """When a finished run continues to a higher steps: hold (the learning rate stays where the finished schedule ended) or restart (the schedule runs again over the added steps: its warmup, then its decay). A run resumed before its end keeps its schedule."""
    batch_size: int = 8
    """Global batch size in sequences (across all processes and microbatches)."""
    accumulation: int = 1
    """Microbatches per step (gradient accumulation); the gradient equals the full batch's."""
    offload_optimizer_state: bool = False
    """Keep the optimizer state in the host's pinned memory between steps (memory_kind pinned_host), moving it to the device for each update: the device holds parameters, gradients and activations only between updates. Needs a backend with pinned_host memory (TPU, GPU, JAX's CPU backend)."""
    seed: int = 0
    """Initialisation and dropout seed."""
    init: str = "auto"
    """auto | scratch | resume | checkpoint:PATH | weights:PATH | hf:PATH. A run with checkpoints of its own always resumes them (except scratch, which refuses); the source only seeds the first start."""
    hf_strict_config: bool = False
    """With init=hf:PATH: refuse every config.json key that Halyard's rule for the family does not name. Default false: keys transformers does not read for that architecture (is_llama_config, ...) are ignored."""
    mesh: MeshSpec = field(default_factory=MeshSpec)
    """Device mesh: sizes of the data, replica, fsdp, tensor, ... axes (-1 takes the devices left)."""
    layout: str = "data_parallel"
    """Where weights live: data_parallel | fsdp | tensor_parallel | fsdp_tensor | expert_parallel."""
    min_shard: int = 4096
    """Weights with fewer elements stay replicated."""
    z_loss_weight: float = 0.0
    """Weight of the z-loss (logsumexp(logits)^2)."""
    nonfinite: str = "skip"
    """NaN/Inf loss policy: skip (keep the old weights, count) or stop (save nothing newer and exit)."""
    max_nonfinite_steps: int = 10
    """With nonfinite=skip, stop after this many skipped steps."""
    log_every: int = 10
    """Log metrics every this many steps."""
    eval_every: int = 0
    """Validation every this many steps (0: only at the end, when data.validation_fraction > 0)."""
    eval_batches: int = 4
    """Validation batches per evaluation."""
    profile_start: int | None = None
    """First step of a profiler trace written to <run_dir>/profile (null: no trace)."""
    profile_steps: int = 3
    """Steps in the profiler trace."""
    sample_prompt: str | None = None
    """Text to continue at the end of training (a sample of the model's output)."""
    sample_tokens: int = 64
    """Tokens to generate for the sample."""
    sample_temperature: float = 0.8
    """Sampling temperature for the sample (0: greedy); top-k 40 when above 0, seeded by trainer.seed."""
    progress: bool = True
    """Show a progress bar."""
    plot: bool = True
    """Write the loss against the step to <run_dir>/loss.png at the end (matplotlib, about a second)."""
    compilation_cache: str | None = "~/.cache/halyard/jax"
    """Folder of JAX's persistent compilation cache: a run that starts again (a resume, the next run of the same shapes) loads its compiled programs instead of compiling them (null: no cache; JAX_COMPILATION_CACHE_DIR, when set, wins)."""
    invariant: bool = False
    """Bitwise-identical training on any split of the batch over the replica, data and fsdp mesh axes and any process count (docs/concepts/reproducibility.md): each microbatch is cut into trainer.invariant_slices slices computed alike and summed in one fixed order, norms summed in fixed chunks in a fixed order. For adamw and lion; the tensor, sequence, stage and expert axes must be 1."""
    invariant_slices: int = 0
    """With trainer.invariant: slices per microbatch, a power of two; the devices on replica x data x fsdp must divide it. 0 takes the largest power of two that divides a microbatch's rows (batch_size / accumulation)."""
    objective: str = "lm"
    """What the run minimises: lm (next-token cross-entropy on the target tokens), dpo (direct preference optimisation on data.format=preference pairs against the frozen initial weights; see the dpo section) or grpo (reinforcement learning with verifiable rewards on data.format=prompts: the engine samples completions with the current weights, rewards score them; see the rl section), or doremi (the proxy run of DoReMi on a data.mixture: Group DRO against a reference model, learning the sources' weights; see the doremi section and `halyard doremi`)."""
    watch: WatchConfig = field(default_factory=WatchConfig)
    """Statistics every trainer.watch.every steps: norms per module and per layer, what the model reports from inside its layers, histograms (off by default)."""
    spikes: SpikeConfig = field(default_factory=SpikeConfig)
    """The loss-spike test: a step's loss far above the recent steps' is logged with its data position and worst examples (halyard replay recomputes it)."""

    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "precision": "set model.param_dtype (stored parameters, e.g. float32) and model.compute_dtype "
        "(forward and backward, e.g. bfloat16) instead: the model's dtypes are the run's one precision",
    }
    """Keys this section no longer has -> what to set instead (`check_keys` names them)."""

    def __post_init__(self) -> None:
        if self.init not in INIT_MODES and not self.init.startswith(INIT_PREFIXES):
            raise ValueError(
                f"trainer.init={self.init!r}: use one of {INIT_MODES} or checkpoint:PATH, weights:PATH, hf:PATH"
            )
        if self.steps < 0:
            raise ValueError(f"trainer.steps={self.steps}: must be 0 or more")
        for key, value in (("batch_size", self.batch_size), ("accumulation", self.accumulation)):
            if value < 1:
                raise ValueError(f"trainer.{key}={value}: must be at least 1")
        if self.batch_size % self.accumulation:
            raise ValueError(
                f"trainer.batch_size={self.batch_size} is not divisible by trainer.accumulation={self.accumulation}"
            )
        self._check_invariant_slices()
        if self.nonfinite not in ("skip", "stop"):
            raise ValueError(f"trainer.nonfinite={self.nonfinite!r}: use skip or stop")
        if self.continue_schedule not in ("hold", "restart"):
            raise ValueError(f"trainer.continue_schedule={self.continue_schedule!r}: use hold or restart")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"trainer.objective={self.objective!r}: use one of {', '.join(OBJECTIVES)}")

    def _check_invariant_slices(self) -> None:
        slices, rows = self.invariant_slices, self.batch_size // self.accumulation
        if slices < 0 or slices & (slices - 1):
            raise ValueError(
                f"trainer.invariant_slices={slices}: use a power of two (1, 2, 4, ...) or 0 (auto)"
            )
        if rows % max(slices, 1):
            raise ValueError(
                f"trainer.invariant_slices={slices} does not divide the {rows} rows of a microbatch "
                "(trainer.batch_size / trainer.accumulation)"
            )

    @property
    def canonical_slices(self) -> int:
        """The invariant step's slices per microbatch: ``invariant_slices``, or for 0 the largest power of two
        dividing a microbatch's rows."""
        rows = self.batch_size // self.accumulation
        return self.invariant_slices or rows & -rows


def _default_model() -> ModelConfig:
    return model_config(
        "llama",
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=384,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position=1024,
    )


@dataclass(frozen=True)
class TrainConfig:
    """A training run: model, data, optimizer, trainer, checkpoints and trackers."""

    model: ModelConfig = field(default_factory=_default_model)
    """The model: `type:` names one of halyard.models' families (`type:` lists those registered), the other keys its shape and settings."""
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=AdamWConfig)
    """The optimizer (`type:` adamw | lion | sophia_h | muon) with its schedule."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    """lm-evaluation-harness tasks during training (see README, Evaluating with lm-evaluation-harness)."""
    trackers: list[TrackerConfig] = field(default_factory=lambda: [JsonlTrackerConfig()])
    """Where metrics go: a list of `type:` jsonl | tensorboard | wandb (wandb works offline)."""
    dpo: DpoConfig = field(default_factory=DpoConfig)
    rl: RlConfig = field(default_factory=RlConfig)
    """Reinforcement learning with verifiable rewards (trainer.objective: grpo): how completions are sampled, scored and turned into the policy loss."""
    doremi: DoremiConfig = field(default_factory=DoremiConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters: with lora.rank > 0 only adapters on lora.target_modules train and the weights trainer.init names stay frozen (see README, LoRA fine-tuning)."""

    def __post_init__(self) -> None:
        check_objective_data(self.trainer.objective, self.data.format)
        check_doremi_run(self)
        if self.data.mixture.sources:
            block_rows(self.data.mixture, self.trainer.batch_size)  # a block size that splits a schedule step
