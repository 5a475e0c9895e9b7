"""``train`` / ``halyard train``: train a model from a config (``--print_config``: show it instead)."""

from __future__ import annotations

from collections.abc import Sequence

from halyard.named.nn import unfuse_multiply_add
from halyard.shard import initialize
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.checkpoint.preemption import PreemptionFlag
from halyard.train.commands.config_show import PRINT_CONFIG_FLAG, print_config
from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import parse_config
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.interruption import stop_run
from halyard.train.trainer.preflight import finished_step
from halyard.train.trainer.trainer import Trainer
from halyard.train.user_errors import one_line
from halyard.train.watch.host import is_per_part


def train_command(argv: Sequence[str], *, preemption: PreemptionFlag | None = None) -> int:
    """Train from ``--config CONFIG [--section.key value ...]`` and print the last metrics.

    Args:
        argv: the command line after ``train``.
        preemption: the Ctrl-C / SIGTERM flag, installed before this module was imported (default: the
            Trainer installs its own).
    """
    if PRINT_CONFIG_FLAG in argv:  # the resolved config with every meaning, instead of training
        return print_config([arg for arg in argv if arg != PRINT_CONFIG_FLAG])
    config = parse_config(TrainConfig, resolve_config_paths(argv), prog="train")
    if preemption is not None and preemption.requested:  # before the processes join: this process alone
        stop_run(preemption, "before the run started; nothing was written", report=True)
    if config.trainer.invariant or (config.trainer.objective == "grpo" and config.rl.deterministic):
        # Before XLA starts: a multiply and an add contracted into one fused multiply-add where both land in
        # one fused loop, which differs between a 1-device and an 8-device program (trainer.invariant) and
        # between the sampler's and the trainer's programs (rl.deterministic).
        unfuse_multiply_add()
    try:
        initialize()  # alone, unless the environment names several processes (halyard.shard.cluster)
    except ValueError as error:  # HALYARD_* coordinates incomplete or not integers, HALYARD_CLUSTER unknown
        raise ConfigError(one_line(str(error))) from error
    if preemption is not None:
        preemption.reinstall()  # jax.distributed's own SIGTERM handler replaced it in a multi-process run
    trainer = Trainer(config, preemption=preemption)  # checks the config (nothing is written yet)
    finished = finished_step(config)
    if finished is not None:  # nothing to train: no evaluation again, nothing written
        cfg = config.trainer
        print(
            f"{cfg.run_dir} is finished: its latest checkpoint is step {finished} (trainer.steps={cfg.steps}); "
            "nothing to do. Raise trainer.steps to train it further",
            flush=True,
        )
        return 0
    result = trainer.fit()
    if result.last_metrics:  # the run's global figures, on every process's console (each host has its own)
        last = {k: v for k, v in result.last_metrics.items() if k != "step" and not is_per_part(k)}
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(last.items()))
        parts = len(result.last_metrics) - len(last) - ("step" in result.last_metrics)
        more = f" (and {parts} per module and per layer, in the trackers)" if parts else ""
        print(f"finished at step {int(result.state.step)}: {shown}{more}", flush=True)
    return 0
