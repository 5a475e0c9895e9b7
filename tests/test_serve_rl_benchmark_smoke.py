"""Smoke runs of benchmarks/serving/serve.py, benchmarks/rl/rl.py and rl_tpu.py at their quick sizes: every figure is produced
(also of the int8 ones: serving/serve_int8_quality.py --quick, and the TPU profile's decode with --quantization none
int8).

(The old generate arm checks out an earlier commit and the deterministic arm repeats the engine's: both are
left to the full runs, which benchmarks/README.md reports.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str, output: Path) -> dict:
    """Run ``benchmarks/<script>`` and return its JSON."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "benchmarks"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--output", str(output)],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT / "benchmarks",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(output.read_text())


def test_serve_benchmark_quick(tmp_path: Path) -> None:
    result = _run(
        "serving/serve.py",
        "--quick",
        "--skip",
        "old_generate",
        "--repeats",
        "2",
        output=tmp_path / "serve.json",
    )
    assert set(result["arms"]) == {
        "engine",
        "engine_deterministic",
        "engine_training_arithmetic",
        "transformers",
    }
    assert result["ratios"]["engine_over_transformers_throughput"] > 0
    assert result["ratios"]["deterministic_over_fast_seconds"] > 0
    assert len(result["deterministic_over_fast_each_repeat"]) == 2
    assert result["ratios"]["training_arithmetic_over_fast_seconds"] > 0
    tokens = {arm["tokens"] for arm in result["arms"].values()}
    assert len(tokens) == 1
    machine = result["machine"]  # what the figures ran on
    assert machine["logical_cpus"] == len(os.sched_getaffinity(0)) and machine["torch_threads"] >= 1


def test_cpu_machine_tells_hyperthreads_from_cores(tmp_path: Path) -> None:
    """benchmarks/cpu_machine.py: two logical CPUs on one core are one core of two threads; XLA's pool is
    one thread per logical CPU unless ``PJRT_NPROC`` says otherwise; a missing topology is unknown."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from cpu_machine import describe, summary

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\nflags\t\t: fma avx2 avx512f avx512_fp16\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\n"
    )
    for cpu in (0, 1):
        topology = tmp_path / "sys" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text("0\n")  # hyperthreads of one core
    one_core = describe({}, cpuinfo, tmp_path / "sys", cpus={0, 1})
    assert (one_core["vendor"], one_core["model"]) == ("GenuineIntel", "Xeon")
    assert (one_core["logical_cpus"], one_core["physical_cores"], one_core["threads_per_core"]) == (2, 1, 2.0)
    assert one_core["isa"] == ["avx2", "fma", "avx512f", "avx512_fp16"] and one_core["xla_threads"] == 2
    assert "1 cores x 2 threads" in summary(one_core)
    (tmp_path / "sys" / "cpu1" / "topology" / "core_id").write_text("1\n")
    two_cores = describe({"PJRT_NPROC": "1"}, cpuinfo, tmp_path / "sys", cpus={0, 1})
    assert (two_cores["physical_cores"], two_cores["threads_per_core"], two_cores["xla_threads"]) == (
        2,
        1.0,
        1,
    )
    unknown = describe({}, cpuinfo, tmp_path / "sys", cpus={0, 5})
    assert unknown["physical_cores"] is None and "cores unknown" in summary(unknown)


def test_serve_benchmark_tpu_profile_runs_small_on_a_cpu(tmp_path: Path) -> None:
    """``--profile tpu-small``: the TPU profile's path (decode against the roofline, arrivals at once and at a
    fixed rate) with a tiny model, each step shape compiled at first use (24 requests at 50 a second)."""
    result = _run(
        "serving/serve.py",
        "--profile",
        "tpu-small",
        "--no-warmup",
        "--rate",
        "50",
        output=tmp_path / "serve_tpu.json",
    )
    decode = result["decode"]
    assert decode["steps_measured"] == 4 and decode["over_roofline"] > 1 and 0 < decode["host_share"] <= 1.5
    assert decode["kv_bytes_read"] > 0 and decode["weight_bytes"] == result["weight_bytes"] > 0
    for phase in ("at_once", "rate"):
        figures = result[phase]
        assert figures["finished"] == figures["requests"] == 24 and not figures["truncated"]
        assert figures["output_tokens"] > 0 and 0 < figures["ttft_p50"] <= figures["ttft_p90"]
    assert result["rate"]["rate"] == 50


def test_serve_host_step_benchmark_runs_small(tmp_path: Path) -> None:
    """benchmarks/probes/serve_host_step.py at a tiny size, profiled: a host time per decode step of every row."""
    result = _run(
        "probes/serve_host_step.py", "--rows", "8", "--prompt", "16", "--steps", "4", "--page-size", "8",
        "--max-context", "64", "--profile", output=tmp_path / "serve_host_step.json",
    )  # fmt: skip
    assert result["steps"] == len(result["host_cpu_seconds"]) == 4 and result["rows"] == 8
    assert result["host_cpu_seconds_median"] > 0 and result["wall_seconds_median"] > 0
    assert 0 <= result["gc_seconds_mean"] <= result["host_cpu_seconds_mean"] and not result["gc_freeze"]


def test_rl_benchmark_quick(tmp_path: Path) -> None:
    result = _run("rl/rl.py", "--quick", output=tmp_path / "rl.json")
    shares = result["share_rollouts"] + result["share_handover"] + result["share_training"]
    assert abs(shares - 1.0) < 1e-6 and result["rollout_tokens_per_second"] > 0


def test_rl_tpu_benchmark_splits_padded_and_packed_rows_on_cpu(tmp_path: Path) -> None:
    """benchmarks/rl/rl_tpu.py's chip comparison at the quick shape on the CPU: the padded rows (before
    rl.pack) and the packed ones, each split with its training tokens/s, MFU and row fill, side by side."""
    result = _run(
        "rl/rl_tpu.py", "--work", str(tmp_path / "work"), "--demo-steps", "0", "--shapes", "quick",
        "--variants", "padded", "packed-fast", "--limit", "880", output=tmp_path / "rl_tpu.json",
    )  # fmt: skip
    padded, packed = result["split_quick_padded"], result["split_quick_packed-fast"]
    assert padded["exit_code"] == packed["exit_code"] == 0
    assert padded["rows"] == "padded" and padded["deterministic"] and not packed["deterministic"]
    assert packed["training_rows"] < padded["training_rows"] == 64
    assert packed["training_row_fill"] > padded["training_row_fill"]
    assert padded["training_mfu"] > 0 and packed["training_mfu"] > 0
    assert padded["training_mfu_all_tokens"] > padded["training_mfu"]  # the prompts' tokens count there too


def test_grpo_rows_probe_times_padded_and_packed_rows(tmp_path: Path) -> None:
    """benchmarks/probes/grpo_rows.py at the quick shape, short completions (under a page: aligned packing
    saves rows too): the aligned packing's log-probs are the padded rows' bit for bit, in fewer rows."""
    result = _run(
        "probes/grpo_rows.py", "--shape", "quick", "--sequences", "16", "--repeats", "1", "--completion-range", "1",
        "16", "--pack-width", "256", output=tmp_path / "grpo_rows.json",
    )  # fmt: skip
    for mode in ("deterministic", "fast"):
        padded, packed = result[f"padded_{mode}"], result[f"packed_{mode}"]
        assert packed["rows"] < padded["rows"] == 16 and packed["row_fill"] > padded["row_fill"]
        assert packed["step_cpu_seconds"] > 0 and result[f"packed_over_padded_{mode}"] > 0
    assert result["packed_deterministic"]["logp_difference_to_padded"] == 0.0


def test_serve_structured_benchmark_tiny(tmp_path: Path) -> None:
    """benchmarks/serving/serve_structured.py at a tiny size: every figure is produced (the chip's are the lead's)."""
    result = _run(
        "serving/serve_structured.py", "--size", "small", "--requests", "2", "--constrained", "1", "--tokens", "8",
        "--repeats", "1", output=tmp_path / "structured.json",
    )  # fmt: skip
    assert result["mask_us"] > 0 and set(result["arms"]) == {"free_only", "with_constrained", "logit_bias"}
    assert (
        result["arms"]["with_constrained"]["steps_pipelined"]
        < result["arms"]["logit_bias"]["steps_pipelined"]
    )
    assert all(ratio > 0 for ratio in result["ratios"].values())


def test_serve_lora_benchmark_tiny(tmp_path: Path) -> None:
    """benchmarks/serving/serve_lora.py at a tiny size: each arm's tokens/s and its ratio to the base."""
    result = _run(
        "serving/serve_lora.py", "--requests", "2", "--tokens", "4", "--adapters", "2", "--rank", "4",
        "--repeats", "1", output=tmp_path / "lora.json",
    )  # fmt: skip
    arms = result["results"]
    assert (
        set(arms) == {"base", "adapters_base_rows", "adapters_mixed"}
        and arms["base"]["relative_to_base"] == 1
    )
    assert all(arm["tokens_per_second"] > 0 for arm in arms.values())


def test_quality_benchmark_quick(tmp_path: Path) -> None:
    result = _run("serving/serve_int8_quality.py", "--quick", output=tmp_path / "quality.json")
    assert set(result["arms"]) == {"bfloat16", "int8"} and "--quick" in result["command"]
    int8 = result["arms"]["int8"]
    assert 0.9 < int8["perplexity_ratio_to_bfloat16"] < 1.1
    assert 0 < int8["logprob_difference_mean"] <= int8["logprob_difference_max"]
    assert 0 <= int8["greedy_identical_continuations"] <= int8["greedy_tokens_before_divergence"] <= 1


def test_tpu_profile_decodes_with_both_quantizations(tmp_path: Path) -> None:
    result = _run(
        "serving/serve.py", "--profile", "tpu-small", "--phases", "decode", "--no-warmup", "--quantization", "none",
        "int8", output=tmp_path / "serve_tpu.json",
    )  # fmt: skip
    none, int8 = result["arms"]["none"], result["arms"]["int8"]
    assert none["decode"]["steps_measured"] == int8["decode"]["steps_measured"] == 4
    assert int8["weight_bytes"] < none["weight_bytes"] == result["weight_bytes"]
    ratio = int8["decode"]["tokens_per_second"] / none["decode"]["tokens_per_second"]
    assert result["int8_over_none_decode_tokens_per_second"] == ratio


def test_serve_speculative_benchmark_quick(tmp_path: Path) -> None:
    """benchmarks/serving/serve_speculative.py with the tiny model: every arm's figure (the script checks that
    their tokens are equal)."""
    result = _run(
        "serving/serve_speculative.py", "--quick", "--repeats", "1", "--segment", "16", "--new-tokens", "24",
        "--draft", output=tmp_path / "speculative.json",
    )  # fmt: skip
    assert set(result["arms"]) == {"none", "ngram", "draft"}
    assert all(arm["tokens_per_second"] > 0 for arm in result["arms"].values())
    assert (
        0 < result["arms"]["ngram"]["accepted_share"] <= 1 and result["arms"]["draft"]["accepted_share"] == 1
    )
