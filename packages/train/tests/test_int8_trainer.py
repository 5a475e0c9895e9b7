"""``model.quantization: int8`` through `train` and `halyard plan`: one tiny run on 8 simulated devices (FSDP,
2 microbatches a step, bfloat16 compute, a checkpoint) trains like the same run in bfloat16, and resumes from
its checkpoint to the same bits; the plan finds the int8 products of the forward pass and both gradients in
the trainer's own step; a family whose layers cannot be quantized is refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from trainer_fixtures import (
    StopAfter,
    assert_bitwise_equal,
    fails,
    load_config,
    run_losses,
    save_tiny_hf_llama,
    write_config,
)

from halyard.train.cli import main, train_main
from halyard.train.plan.tpu_topology import libtpu_path
from halyard.train.run.sources import model_config_of
from halyard.train.trainer.trainer import Trainer

STEPS = 6
RUN = {
    "model": {"quantization": "int8", "compute_dtype": "bfloat16"},
    "trainer": {
        "steps": STEPS,
        "batch_size": 16,
        "accumulation": 2,
        "layout": "fsdp",
        "min_shard": 1,
        "mesh": {"fsdp": 8, "data": 1},
    },
    "checkpoint": {"every_steps": 3},
}
BF16 = {**RUN, "model": {"quantization": "none", "compute_dtype": "bfloat16"}}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("int8-cache")


def trained(folder: Path, cache_dir: Path, sections: dict) -> Path:
    """``train --config`` of the tiny run with ``sections``, in this process (8 devices); its config file."""
    config = write_config(folder / "run.yaml", folder / "run", cache_dir, **sections)
    assert train_main(["--config", str(config)]) == 0
    return config


@pytest.fixture(scope="module")
def int8_config(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    return trained(tmp_path_factory.mktemp("int8"), cache_dir, RUN)


def test_an_int8_run_with_fsdp_and_accumulation_trains_like_bfloat16(
    tmp_path: Path, cache_dir: Path, int8_config: Path
) -> None:
    run_dir = int8_config.parent / "run"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["quantization"] == "int8"
    int8 = run_losses(run_dir)
    bf16 = run_losses(trained(tmp_path, cache_dir, BF16).parent / "run")
    assert len(int8) == len(bf16) == STEPS
    assert int8 != bf16  # the int8 products ran
    # 1/127 half-steps over a few updates: the losses stay within 1% of bfloat16's, which fall.
    np.testing.assert_allclose(int8, bf16, rtol=0.01)
    assert int8[-1] < int8[0] - 0.1


def test_an_int8_run_resumes_from_its_checkpoint_to_the_same_bits(tmp_path: Path, int8_config: Path) -> None:
    whole = int8_config.parent / "run"
    reference = Trainer(load_config(int8_config)).restore_state(STEPS)
    again = tmp_path / "run.yaml"
    again.write_text(int8_config.read_text().replace(str(whole), str(tmp_path / "run")))
    with pytest.raises(SystemExit):
        Trainer(load_config(again), preemption=StopAfter(3)).fit()
    resumed = Trainer(load_config(again)).fit()
    assert [h["step"] for h in resumed.history] == list(range(4, STEPS + 1))
    assert [h["loss"] for h in resumed.history] == run_losses(whole)[3:]
    assert_bitwise_equal(reference.params, resumed.state.params)
    assert_bitwise_equal(reference.opt_state, resumed.state.opt_state)


def test_the_plan_finds_the_int8_products_of_the_trainers_step(
    int8_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["plan", "--config", str(int8_config), "--devices", "8"]) == 0
    report = capsys.readouterr().out
    # 7 projections a layer (q, k, v, o, gate, up, down), the layer scan's body once: 21 products.
    assert "21 int8 x int8 -> int32 matmuls in the step (7 forward, 7 input-gradient, 7 weight-gradient)" in (
        report
    ), report
    assert "int8 peak 1979 TOPS" in report and "step time with int8" in report


def test_int8_applies_to_a_model_read_from_a_hugging_face_folder(tmp_path: Path, int8_config: Path) -> None:
    folder = save_tiny_hf_llama(tmp_path / "hf")
    model = model_config_of(load_config(int8_config, "--trainer.init", f"hf:{folder}"))
    assert model.quantization == "int8" and model.hidden_size == 32  # the run's setting, the folder's shape


# In a child process, so that libtpu never loads into the test worker: the run's step compiled by the TPU's own
# compiler for one v5e chip; prints how many of its products are int32 sums of two int8 operands.
TPU_CHILD = """
import re, sys
from halyard.named.nn import compiling_for
from halyard.shard import use_layout
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.plan.step_memory import _abstract_batch, _with_shardings
from halyard.train.plan.tpu_topology import topology_devices
from halyard.train.run.setup import RunSetup
from halyard.train.run_config import TrainConfig
config = parse_config(TrainConfig, resolve_config_paths(["--config", sys.argv[1], "--trainer.mesh.fsdp", "1"]))
setup = RunSetup(config, devices=topology_devices("TPU v5e", 1)[0])
state = _with_shardings(*setup.abstract_state)
with use_layout(setup.layout, setup.mesh), compiling_for("tpu", "tpu"):
    text = setup.train_step().lower(state, _abstract_batch(config, setup), None).compile().as_text()
int8 = set(re.findall(r"(%[\\w.-]+) = s8\\[", text))
products = re.findall(r"= s32\\[[^ ]* (?:convolution|dot)\\((%[\\w.-]+), (%[\\w.-]+)\\)", text)
print(sum(a in int8 and b in int8 for a, b in products))
"""


@pytest.mark.skipif(libtpu_path() is None, reason="needs libtpu (make venv installs it) to compile for a TPU")
def test_the_tpu_compiler_keeps_the_int8_products(int8_config: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", TPU_CHILD, str(int8_config)], capture_output=True, text=True, timeout=600
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split()[-1] == "21", child.stdout[-2000:]  # 7 projections x 3 products, as lowered


def test_a_family_whose_layers_cannot_be_quantized_is_refused_in_one_line(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path / "run.yaml", tmp_path / "run", cache_dir, **RUN))
    code, err = fails(
        capsys, ["train", "--config", config, "--model.type", "mixtral", "--model.num_experts", "2"]
    )
    assert code == 2 and "model.quantization=int8 (MixtralConfig)" in err and "ragged_dot" in err, err
    code, err = fails(capsys, ["train", "--config", config, "--model.quantization", "int4"])
    assert code == 2 and "model.quantization=int4" in err and "none, int8" in err, err
    assert not (tmp_path / "run").exists()
