"""Peak table lookups, the CPU matmul measurement (cached), MFU arithmetic, and goodput on a fake clock."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jax
import pytest

from halyard.train.perf import peaks
from halyard.train.perf.goodput import Goodput
from halyard.train.perf.mfu import mfu, transformer_train_flops_per_token
from halyard.train.perf.peaks import (
    PEAK_FLOPS,
    clear_measured_peaks,
    device_peak_flops,
    measure_matmul_flops,
    table_key,
)


class FakeClock:
    def __init__(self, start: float = 100.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
        ("Quadro RTX 6000", None),
    ],
)
def test_device_kinds_map_to_table_rows(kind, key):
    assert table_key(kind) == key


def test_table_peaks_for_accelerators():
    h100 = SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    peak = device_peak_flops(h100, "bfloat16")
    assert (peak.flops_per_second, peak.source, peak.device_kind) == (989e12, "table", "H100 SXM")
    assert device_peak_flops(h100, "float32").flops_per_second == 67e12
    assert device_peak_flops(h100, "tf32").flops_per_second == 494.5e12
    tpu = SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    assert device_peak_flops(tpu, "float32").flops_per_second == PEAK_FLOPS["TPU v5e"]["bfloat16"]
    assert "989 TFLOP/s (table)" in peak.describe()
    with pytest.raises(ValueError, match="no int8 peak for H200"):
        device_peak_flops(SimpleNamespace(platform="gpu", device_kind="NVIDIA H200"), "int8")


def test_cpu_peak_is_measured_once_per_process_and_labelled():
    clear_measured_peaks()
    cpu = jax.devices("cpu")[0]
    first = device_peak_flops(cpu, "float32")
    assert first.source == "measured"
    assert 1e6 < first.flops_per_second < 1e14
    assert first.describe().endswith("FLOP/s (measured)")
    assert device_peak_flops(cpu, "float32") is first  # cached: no second benchmark
    clear_measured_peaks()
    assert device_peak_flops(cpu, "float32") is not first


def test_a_measured_peak_is_kept_for_later_processes_of_the_machine(tmp_path, monkeypatch):
    clear_measured_peaks()
    cpu = jax.devices("cpu")[0]
    first = device_peak_flops(cpu, "float32", kept_in=tmp_path / "cache")
    kept = json.loads((tmp_path / "cache" / peaks.PEAKS_FILE).read_text())
    assert list(kept.values()) == [first.flops_per_second]
    clear_measured_peaks()  # as a new process: reads the folder instead of measuring

    def measure_again(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(peaks, "measure_matmul_flops", measure_again)
    assert device_peak_flops(cpu, "float32", kept_in=tmp_path / "cache") == first
    with pytest.raises(AssertionError, match="measured again"):  # another dtype has no kept peak
        device_peak_flops(cpu, "bfloat16", kept_in=tmp_path / "cache")
    with pytest.raises(AssertionError, match="measured again"):  # a remote folder keeps nothing
        device_peak_flops(cpu, "float32", kept_in="gs://bucket/cache")
    clear_measured_peaks()


def test_matmul_measurement_takes_the_fastest_run():
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.75])  # runs of 0.5, 0.25, 0.75 seconds
    flops = measure_matmul_flops("float32", size=8, repeats=3, clock=lambda: next(ticks))
    assert flops == pytest.approx(2 * 8**3 / 0.25)


def test_mfu_arithmetic_and_errors():
    assert mfu(1e15, 2.0, 4, 250e12) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="step_seconds > 0"):
        mfu(1e15, 0.0, 4, 250e12)


def test_transformer_flops_per_token():
    # GPT-2 small-like: 85M matmul params, 12 layers, 768 wide, 1024 tokens
    full = transformer_train_flops_per_token(85_000_000, 12, 768, 1024)
    assert full == 6 * 85_000_000 + 12 * 12 * 768 * 1024
    assert (
        transformer_train_flops_per_token(85_000_000, 12, 768, 1024, causal=True)
        == full - 6 * 12 * 768 * 1024
    )


def test_goodput_accounts_every_activity_on_a_fake_clock():
    clock = FakeClock()
    goodput = Goodput(clock=clock)
    clock.advance(3.0)  # setup: model init, data
    with goodput.step():
        clock.advance(20.0)  # compile + first step
    for _ in range(4):
        clock.advance(0.5)  # data loading between steps
        with goodput.step():
            clock.advance(1.0)
    with goodput.checkpoint():
        clock.advance(2.0)
    with goodput.evaluation():
        clock.advance(4.0)
    with goodput.data_wait():
        clock.advance(1.5)
    goodput.add("step", 3.0, num_steps=3)
    clock.advance(3.0)
    goodput.add("rollout", 6.0)  # GRPO's sampling
    goodput.add("compilation", 9.0)  # the engine's programs
    clock.advance(15.0)
    summary = goodput.summary()
    assert summary == {
        "goodput/total_seconds": 54.5,
        "goodput/time_to_first_step_seconds": 23.0,
        "goodput/first_step_seconds": 20.0,
        "goodput/step_seconds": 7.0,
        "goodput/checkpoint_seconds": 2.0,
        "goodput/evaluation_seconds": 4.0,
        "goodput/data_wait_seconds": 1.5,
        "goodput/rollout_seconds": 6.0,
        "goodput/compilation_seconds": 9.0,
        "goodput/other_seconds": 5.0,
        "goodput/step_fraction": pytest.approx(7.0 / 54.5),
        "goodput/num_steps": 8,
    }
    text = goodput.summary_text()
    assert "12.8% of 54.5 s in training steps (8 steps)" in text
    assert "waiting for data         1.5 s  (  2.8%)" in text
    assert "sampling rollouts        6.0 s  ( 11.0%)" in text
    assert "compiling engine         9.0 s  ( 16.5%)" in text
    assert "time to first step      23.0 s" in text


def test_goodput_counts_time_even_when_the_step_raises():
    clock = FakeClock()
    goodput = Goodput(clock=clock)
    with pytest.raises(RuntimeError), goodput.evaluation():
        clock.advance(1.5)
        raise RuntimeError("eval crashed")
    assert goodput.summary()["goodput/evaluation_seconds"] == 1.5
    with pytest.raises(ValueError, match="unknown activity 'io'"):
        goodput.add("io", 1.0)


def test_goodput_before_any_step():
    clock = FakeClock()
    goodput = Goodput(clock=clock)
    clock.advance(2.0)
    summary = goodput.summary()
    assert summary["goodput/time_to_first_step_seconds"] == 0.0
    assert summary["goodput/other_seconds"] == 2.0
    assert goodput.summary_text().splitlines()[0].startswith("goodput: 0.0%")
