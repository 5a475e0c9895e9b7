"""`halyard plan --accelerator "TPU v5e"` compiles the step for the chip's topology with libtpu's compiler
(installed by `make venv` outside the importable packages), else prints the CPU's estimate and how to get it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_fixtures import write_config

from halyard.train.cli import main
from halyard.train.plan.tpu_topology import LIBTPU_HINT, libtpu_path

# In a child process, so that libtpu never loads into the test worker: the plan through the CLI, then the same
# step compiled directly for the topology's device and its memory analysis summed as the plan sums it.
CHILD = """
import contextlib, io, sys
from halyard.train.cli import main
from halyard.train.plan.step_memory import _abstract_batch, _with_shardings
report = io.StringIO()
with contextlib.redirect_stdout(report):
    assert main(["plan", "--config", sys.argv[1], "--accelerator", "TPU v5e", "--devices", "1"]) == 0
huge = io.StringIO()  # a batch whose logits alone are far beyond the chip's 16 GiB
with contextlib.redirect_stdout(huge):
    assert main(["plan", "--config", sys.argv[1], "--accelerator", "TPU v5e", "--devices", "1",
                 "--trainer.batch_size", "262144"]) == 0
from jax.experimental import topologies
from halyard.named.nn import compiling_for
from halyard.shard import use_layout
from halyard.train.run.setup import RunSetup
from halyard.train.trainer.preflight import check_shapes
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.run_config import TrainConfig
config = parse_config(TrainConfig, resolve_config_paths(["--config", sys.argv[1]]))
topology = topologies.get_topology_desc("v5e:1x1", "tpu", chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
setup = RunSetup(config, devices=list(topology.devices))
check_shapes(setup)
state, batch = _with_shardings(*setup.abstract_state), _abstract_batch(config, setup)
with use_layout(setup.layout, setup.mesh), compiling_for("tpu", "tpu"):
    compiled = setup.train_step().lower(state, batch, None).compile()
analysis = compiled.memory_analysis()
total = analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
total += max(analysis.output_size_in_bytes - analysis.alias_size_in_bytes, 0)
print(report.getvalue())
print("HUGE", huge.getvalue())
print("PLATFORM", topology.devices[0].platform, topology.devices[0].device_kind)
print("DIRECT", total)
"""


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plan_tpu")
    return write_config(folder / "run.yaml", folder / "run", folder / "cache")


def _total_bytes(report: str) -> float:
    """The plan's ``total`` row in bytes (printed in MiB or GiB with two decimals)."""
    row = next(line for line in report.splitlines() if line.strip().startswith("total")).split()
    return float(row[1]) * {"MiB": 2**20, "GiB": 2**30}[row[2]]


@pytest.mark.skipif(libtpu_path() is None, reason=f"no libtpu here: {LIBTPU_HINT}")
def test_a_tpu_plan_is_the_tpu_compilers_memory_analysis_or_its_refusal(config_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(config_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "PLATFORM tpu TPU v5 lite" in result.stdout
    assert "for the v5e:1x1 topology, TPU compiler of libtpu" in result.stdout
    huge = result.stdout.split("HUGE ")[1]
    assert huge.startswith("DOES NOT FIT on TPU v5e (v5e:1x1 topology") and "exceeds available HBM" in huge
    direct = int(result.stdout.split("DIRECT ")[1].split()[0])
    # The report rounds to 0.01 MiB (the tiny step is under 16 MiB).
    assert _total_bytes(result.stdout) == pytest.approx(direct, abs=0.005 * 2**20)


def test_without_libtpu_a_tpu_plan_is_the_cpus_estimate(
    config_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(config_path.parent / "no-libtpu.so"))
    assert libtpu_path() is None
    assert main(["plan", "--config", str(config_path), "--accelerator", "TPU v5e", "--devices", "1"]) == 0
    report = capsys.readouterr().out
    assert "on simulated CPU devices: XLA's CPU buffer assignment, an ESTIMATE" in report
    # No verdict from the wrong compiler, even for a step far beyond the chip: the estimate, and how to get one.
    assert "fits" not in report.lower() and "no fit verdict for TPU v5e (the CPU's estimate" in report
    assert f"for the verdict: get libtpu, then plan again: {LIBTPU_HINT}" in report
    huge = ["--trainer.batch_size", "65536"]
    assert (
        main(["plan", "--config", str(config_path), "--accelerator", "TPU v5e", "--devices", "1", *huge]) == 0
    )
    report = capsys.readouterr().out
    assert "fits" not in report.lower() and "to fit:" not in report and "no fit verdict" in report
