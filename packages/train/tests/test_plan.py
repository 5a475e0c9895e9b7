"""`halyard plan`: memory per device from the compiled step shrinks under FSDP; the report; the CLI path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from harness_fixtures import write_tokenizer
from trainer_fixtures import load_config, write_config

from halyard.train.cli import main
from halyard.train.plan.accelerators import accelerator
from halyard.train.plan.command import format_plan
from halyard.train.plan.step_memory import StepMemory, step_memory

FSDP = {"layout": "fsdp", "min_shard": 0, "mesh": {"data": 1, "fsdp": -1}}


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plan")
    return write_config(folder / "run.yaml", folder / "run", folder / "cache", trainer=FSDP)


@pytest.fixture(scope="module")
def plans(config_path: Path) -> dict[int, StepMemory]:
    config = load_config(config_path)
    return {count: step_memory(config, jax.devices()[:count]) for count in (1, 8)}


def test_fsdp_divides_the_state_over_the_devices(config_path: Path, plans: dict[int, StepMemory]) -> None:
    config, one, eight = load_config(config_path), plans[1], plans[8]
    assert one.mesh == {} and eight.mesh == {"fsdp": 8}
    # Weights and AdamW moments are split eight ways; XLA's arguments are exactly the state and batch.
    assert eight.params * 8 == one.params and one.params == 4 * config.model.num_params()
    assert eight.optimizer_state * 8 == pytest.approx(one.optimizer_state, rel=0.01)
    for plan in (one, eight):
        assert plan.arguments == pytest.approx(plan.params + plan.optimizer_state + plan.batch, abs=64)
    # Activations follow the batch shard (1/8 of the rows); the whole step takes less than a fifth.
    assert eight.batch * 8 == one.batch
    assert 0 < eight.activations < one.activations
    assert eight.total < one.total / 5


def test_the_report_says_whether_it_fits(config_path: Path, plans: dict[int, StepMemory]) -> None:
    config = load_config(config_path)
    report = format_plan(config, plans[8], accelerator("h100", "float32"), mfu=0.4)
    assert "fits on H100 SXM" in report and "of 60.00 GiB usable" in report
    assert "mesh fsdp=8" in report and "8 x 32 = 256 tokens a step" in report
    assert "FLOPs per token" in report and "at 40% MFU" in report
    tiny = accelerator("h100", "float32", memory_gib=plans[8].total / 2**30 / 2)
    assert "DOES NOT FIT on H100 SXM" in format_plan(config, plans[8], tiny, mfu=0.4)
    # A TPU's verdict is its own compiler's: from the CPU's estimate the report gives none.
    for memory_gib in (None, plans[8].total / 2**30 / 2):
        tpu = format_plan(config, plans[8], accelerator("tpu-v5e", "float32", memory_gib), mfu=0.4)
        assert "fits" not in tpu.lower() and "no fit verdict for TPU v5e" in tpu and "get libtpu" in tpu


def test_a_dpo_step_plans_its_pairs(tmp_path: Path, plans: dict[int, StepMemory]) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    tokenizer = str(write_tokenizer(tmp_path / "tokenizer"))
    data = {"builtin_corpus": None, "sources": [str(pairs)], "format": "preference", "tokenizer": tokenizer}
    path = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", data=data)
    config = load_config(path, "--trainer.objective", "dpo")
    plan = step_memory(config, jax.devices()[:1])
    rows, length = config.trainer.batch_size, config.data.seq_len + 1
    # chosen and rejected tokens and masks, and the reference's two log-probs per pair
    assert plan.batch == 4 * rows * length * 4 + 2 * rows * 4
    assert plan.params == plans[1].params and plan.arguments == pytest.approx(
        plan.params + plan.optimizer_state + plan.batch, abs=64
    )


def test_unknown_accelerator_and_batch_that_does_not_split(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert accelerator("h100", "bfloat16").name == "H100 SXM"
    assert accelerator("v5p", "bfloat16").memory_gib == 95
    with pytest.raises(SystemExit) as raised:
        main(["plan", "--config", str(config_path), "--accelerator", "b200"])
    assert raised.value.code == 2 and "unknown accelerator 'b200'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        main(["plan", "--config", str(config_path), "--devices", "8", "--trainer.batch_size", "12"])
    assert raised.value.code == 2 and "trainer.batch_size=12" in capsys.readouterr().err


def test_a_fresh_process_simulates_the_devices_it_needs(config_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    code = "import sys; from halyard.train.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["plan", "--config", str(config_path), "--devices", "4"]
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 devices (mesh fsdp=4)" in result.stdout


def test_an_invariant_plan_prints_the_default_step_beside_it(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--config", str(config_path), "--devices", "8", "--trainer.invariant", "true"]) == 0
    report = capsys.readouterr().out
    total = next(line for line in report.splitlines() if line.strip().startswith("total"))
    default = next(line for line in report.splitlines() if line.strip().startswith("default step"))
    ratio = float(default.split("holds ")[1].rstrip("x"))
    invariant_mib, default_mib = float(total.split()[1]), float(default.split()[2])
    # the figures are printed to 0.01 (MiB and the ratio): what that rounding can move their quotient
    shown = invariant_mib / default_mib
    rounding = shown * (0.005 / invariant_mib + 0.005 / default_mib) + 0.005
    assert "trainer.invariant=false" in default and ratio == pytest.approx(shown, abs=rounding)


def test_a_tpu_plan_counts_bfloat16_weights_and_host_optimizer_state(
    config_path: Path, plans: dict[int, StepMemory], capsys: pytest.CaptureFixture[str]
) -> None:
    """bf16 weights with f32 moments halve the parameters only; offloaded moments leave the device total;
    the step is traced as the TPU's (its matmuls; blocked attention standing in for splash)."""
    base = plans[1]
    config = load_config(
        config_path,
        "--model.param_dtype", "bfloat16",
        "--model.optimizer_dtype", "float32",
        "--trainer.offload_optimizer_state", "true",
    )  # fmt: skip
    tpu = step_memory(config, jax.devices()[:1], "tpu")
    assert tpu.target_backend == "tpu" and tpu.optimizer_on_host
    assert tpu.params * 2 == base.params and tpu.optimizer_state == base.optimizer_state
    # The moments are in host memory: the device's arguments are the weights and the batch.
    assert tpu.arguments == pytest.approx(tpu.params + tpu.batch, abs=64)
    assert tpu.total < base.total - base.optimizer_state
    report = format_plan(config, tpu, accelerator("tpu-v5e", "bfloat16"), mfu=0.4)
    assert "AdamWConfig in float32, in host memory (trainer.offload_optimizer_state)" in report
