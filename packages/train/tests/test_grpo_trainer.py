"""trainer.objective: grpo through `train`, as users run it: the grpo-demo's reward rises, a run killed with
SIGKILL resumes to the uninterrupted run's bits (rollouts, data position, weights), a nucleus run keeps the
sampler's log-probs bit for bit, a watched run logs its per-layer figures, and bad prompt records and reward
functions that raise get one line each."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from trainer_fixtures import assert_bitwise_equal, fails, load_config, run_cli

from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.trainer.trainer import Trainer

# A short run: 4 prompts x 8 completions a step, a checkpoint every 3 steps.
CONFIGS = Path(__file__).parents[1] / "src" / "halyard" / "train" / "configs"
SHORT = [
    "--trainer.steps", "9", "--trainer.batch_size", "32", "--rl.max_running", "32", "--trainer.log_every", "1",
    "--checkpoint.every_steps", "3", "--checkpoint.keep_last", "10", "--trainer.eval_every", "0",
]  # fmt: skip


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def fit_here(args: list[str], *, devices: int, config: str = "grpo-demo") -> None:
    """``train --config CONFIG ARGS`` as `Trainer.fit` (what the command runs) in this process, on ``devices``
    of its devices: no process start. (This process's XLA has no fused multiply-adds, as `train` starts it.)"""
    Trainer(load_config(Path(config), *args), devices=jax.devices()[:devices]).fit()


def test_the_demo_reward_rises_and_the_sampler_agrees_with_the_trainer(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    args = ["--config", "grpo-demo", "--trainer.run_dir", str(run_dir), "--trainer.steps", "100"]
    args += ["--trainer.log_every", "1", "--trainer.eval_every", "100", "--checkpoint.every_steps", "100"]
    # The optimised programs users run: over 100 steps they save more than their longer compile costs.
    result = run_cli(args, devices=1, timeout=900, optimized=True)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [r for r in _records(run_dir) if "reward/mean" in r]
    assert [r["step"] for r in records] == list(range(1, 101))
    first, last = (
        np.mean([r["reward/mean"] for r in records[:10]]),
        np.mean([r["reward/mean"] for r in records[-10:]]),
    )
    assert last > first + 0.1, (first, last)  # the sampled (temperature 1) rewards
    held_out = {r["step"]: r["eval/reward_mean"] for r in _records(run_dir) if "eval/reward_mean" in r}
    assert held_out[0] <= 0.3 and held_out[100] >= 0.6, held_out  # greedy, on prompts never trained on
    for record in records:  # rl.deterministic: the engine's log-probs of the sampled tokens are the trainer's
        assert record["sampling/sampling_logp_difference/max"] == 0.0
        for key in (
            "rollout/handover_seconds",
            "rollout/tokens_per_second",
            "entropy",
            "pass@8",
            "groups/zero_advantage",
        ):
            assert key in record


def test_without_rl_deterministic_the_sampler_agrees_with_the_trainer_to_rounding(tmp_path: Path) -> None:
    """The fast engine and the plain training step: other programs, other roundings (measured on the demo:
    at most 4.8e-7 over 20 steps; the deterministic run above logs 0)."""
    run_dir = tmp_path / "fast"
    args = ["--trainer.run_dir", str(run_dir), *SHORT, "--trainer.steps", "4", "--rl.deterministic", "false"]
    fit_here(args, devices=1)
    differences = [r["sampling/sampling_logp_difference/max"] for r in _records(run_dir) if "loss" in r]
    assert len(differences) == 4 and max(differences) <= 1e-5


NUCLEUS = ["--rl.top_p", "0.9", "--trainer.watch.every", "3"]
"""rl.top_p < 1 (a nucleus), and trainer.watch's per-layer figures every 3 steps (the last step's too)."""


@pytest.fixture(scope="module")
def nucleus_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The SHORT run with a nucleus and watched steps, uninterrupted: its folder and its stdout. One `train`
    run for three tests: the nucleus test's, the watch test's, and the killed run's reference (a nucleus
    changes which tokens are drawn and watching adds figures, not how a run resumes). Trained once per pytest
    run, by the first test worker that needs it (the file's tests may span workers)."""
    from run_wide import (
        shared_folder,
    )  # here: a run's subprocess imports this module (its rewards), without it

    def train(folder: Path) -> None:
        args = ["--config", "grpo-demo", "--trainer.run_dir", str(folder / "nucleus"), *SHORT, *NUCLEUS]
        result = run_cli(args, devices=1)
        assert result.returncode == 0, result.stderr[-3000:]
        (folder / "stdout.txt").write_text(result.stdout)

    folder = shared_folder(tmp_path_factory, "grpo-nucleus", train)[0]
    return folder / "nucleus", (folder / "stdout.txt").read_text()


def test_a_nucleus_run_trains_with_finite_losses_and_the_samplers_log_probs(
    nucleus_run: tuple[Path, str],
) -> None:
    """``rl.top_p < 1``: prompt positions whose next token lies outside the nucleus are masked, not NaN (they
    made every loss NaN before), and the trainer's filtered log-probs are still the sampler's bit for bit."""
    steps = [r for r in _records(nucleus_run[0]) if "loss" in r]
    assert len(steps) == 9
    assert all(
        math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["nonfinite"] == 0 for r in steps
    )
    assert all(r["sampling/sampling_logp_difference/max"] == 0.0 for r in steps)


def test_a_grpo_run_watches_its_steps_too(nucleus_run: tuple[Path, str]) -> None:
    """trainer.watch on a GRPO run (was in test_watch_trainer.py, with a run of its own)."""
    run_dir, stdout = nucleus_run
    lines = {line["step"]: line for line in _records(run_dir)}
    watched = [step for step, line in sorted(lines.items()) if "activation/rms/layers/0" in line]
    assert watched == [3, 6, 9] and all("grad_norm/layers/1" in lines[step] for step in watched)
    finished = next(line for line in stdout.splitlines() if line.startswith("finished at step 9"))
    assert "/layers/" not in finished and "per module and per layer, in the trackers" in finished


def test_a_killed_run_resumes_to_the_uninterrupted_runs_bits(
    tmp_path: Path, nucleus_run: tuple[Path, str]
) -> None:
    reference_dir, killed_dir = nucleus_run[0], tmp_path / "killed"
    code = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    args = ["--config", "grpo-demo", "--trainer.run_dir", str(killed_dir), *SHORT, *NUCLEUS]
    flags = "--xla_force_host_platform_device_count=1 " + os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", "")
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and child.poll() is None:
        if (latest_complete(killed_dir / "checkpoints") or 0) >= 3:
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert (latest_complete(killed_dir / "checkpoints") or 0) in (3, 6), (
        "the child should die between checkpoints"
    )
    fit_here(args[2:], devices=1)  # resumed by `Trainer.fit` in this process: the killed process's programs
    wanted = ("loss", "reward/mean", "completion/length_mean", "grad_norm")
    by_step = {r["step"]: r for r in _records(killed_dir) if "loss" in r}
    for record in (r for r in _records(reference_dir) if "loss" in r):
        assert {k: by_step[record["step"]][k] for k in wanted} == {k: record[k] for k in wanted}
    restored = [
        Trainer(load_config(Path("grpo-demo"), "--trainer.run_dir", str(folder), *SHORT, *NUCLEUS))
        .restore_state(9)
        .params
        for folder in (reference_dir, killed_dir)
    ]
    assert_bitwise_equal(*restored)


def raising_reward(prompt: str, completion: str, answer: str) -> float:
    """A reward function with a bug (for the test below)."""
    raise ZeroDivisionError("the reward divided by zero")


def test_a_reward_that_raises_names_the_function_and_the_example(tmp_path: Path) -> None:
    run_dir = tmp_path / "raising"
    args = [
        "--config",
        "grpo-demo",
        "--trainer.run_dir",
        str(run_dir),
        *SHORT,
        "--rl.rewards",
        "[test_grpo_trainer:raising_reward]",
    ]
    result = run_cli(args, devices=1, cwd=Path(__file__).parent)
    assert result.returncode == 1
    (message,) = [line.split("error: ", 1)[1] for line in result.stderr.splitlines() if "error: " in line]
    assert "test_grpo_trainer:raising_reward" in message and "ZeroDivisionError" in message, message
    assert "prompts.jsonl:" in message  # the example's record


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ('{"prompt": "", "answer": "1"}', "the prompt ('prompt') is empty"),
        ('{"prompt": "12>"}', "no 'answer' field"),
        ('{"prompt": "12>", "answer": "1"', "malformed JSON"),
        ('{"question": "12>", "answer": "1"}', "set data.prompt_field"),
    ],
)
def test_a_bad_prompt_record_gets_one_line_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, complaint: str
) -> None:
    records = tmp_path / "prompts.jsonl"
    records.write_text('{"prompt": "34>", "answer": "4"}\n' + line + "\n")
    from halyard.train.corpora.max_digit import write_max_digit_prompts

    _, tokenizer = write_max_digit_prompts(tmp_path / "corpus")
    code, message = fails(
        capsys,
        [
            "train", "--config", "grpo-demo", "--trainer.run_dir", str(tmp_path / "run"), "--data.builtin_corpus", "null",
            "--data.sources", f"[{records}]", "--data.tokenizer", str(tokenizer), "--data.validation_fraction", "0",
        ],
    )  # fmt: skip
    assert code == 2 and complaint in message and f"{records}:2" in message, message


def test_two_processes_train_what_one_process_of_as_many_devices_trains(tmp_path: Path) -> None:
    from trainer_fixtures import start_processes

    # Two steps: the second step's rollouts come from weights the first update handed over on both processes.
    steps = ["--trainer.steps", "2", "--checkpoint.every_steps", "2", "--trainer.mesh.data", "4"]
    args = lambda folder: ["--config", "grpo-demo", "--trainer.run_dir", str(folder), *SHORT, *steps]
    # The one-process run: `train`'s code path in this process, on 4 of its devices (no process start).
    fit_here(args(tmp_path / "one")[2:], devices=4)
    processes = start_processes(args(tmp_path / "two"))
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
    wanted = ("reward/mean", "completion/length_mean")
    one = [{k: r[k] for k in wanted} for r in _records(tmp_path / "one") if "loss" in r]
    two = [{k: r[k] for k in wanted} for r in _records(tmp_path / "two") if "loss" in r]
    assert len(two) == 2 and one == two  # the same rollouts: every process runs the engine's same steps
    losses = [
        [r["loss"] for r in _records(folder) if "loss" in r]
        for folder in (tmp_path / "one", tmp_path / "two")
    ]
    # On-policy with one update a batch, a token's ratio is exp(logp - logp) = 1 exactly: the loss is minus
    # the mean of the completions' advantages (token means of 1), whatever the weights, added up over the
    # batch's 32 completions (4 prompts x 8) in another order on another mesh; they cancel to ~0, so at their
    # size: a group of 8's standardised reward (Bessel's) is at most 7 / sqrt(8).
    from float_tolerance import (
        summation_tolerance,
    )  # here: a run's subprocess imports this module, without it

    demo = yaml.safe_load((CONFIGS / "grpo-demo.yaml").read_text())
    group, tokens = demo["rl"]["group_size"], demo["rl"]["max_new_tokens"]
    bound = summation_tolerance((group - 1) / math.sqrt(group), 32 + tokens)
    np.testing.assert_allclose(losses[1], losses[0], atol=bound, rtol=0)


def test_the_gsm8k_recipe_fits_one_h200_and_trains_at_smoke_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from halyard.train.cli import main

    assert (
        main(["plan", "--config", "qwen2.5-0.5b-grpo-gsm8k", "--devices", "1", "--accelerator", "H200"]) == 0
    )
    plan = capsys.readouterr().out
    assert "fits on H200" in plan and "engine pages" in plan, plan
    smoke = [
        "--trainer.run_dir", str(tmp_path / "run"),
        "--model.vocab_size", "16", "--model.hidden_size", "32", "--model.intermediate_size", "64",
        "--model.num_layers", "2", "--model.num_heads", "4", "--model.num_kv_heads", "2", "--model.max_position", "64",
        "--data.builtin_corpus", "max-digit", "--data.chat_template", "simple", "--data.seq_len", "64",
        "--trainer.steps", "2", "--trainer.batch_size", "16", "--rl.max_running", "16", "--rl.max_new_tokens", "4",
        "--rl.page_size", "64", "--trainer.eval_every", "0",
    ]  # fmt: skip
    fit_here(smoke, devices=1, config="qwen2.5-0.5b-grpo-gsm8k")
    assert [r["step"] for r in _records(tmp_path / "run") if "reward/math/mean" in r] == [1, 2]
