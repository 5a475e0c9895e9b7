"""DPO through the `halyard train` command: preference data, the frozen reference, TRL's metric names."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, decoder_terms, summation_tolerance
from test_sft_trainer import make_tokenizer
from trainer_fixtures import TINY, load_config, write_config

from halyard.models import LlamaConfig
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.cli import main
from halyard.train.config.errors import ConfigError
from halyard.train.trainer.trainer import Trainer

REWARD_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
BETA, PAIRS = 0.5, TINY["trainer"]["batch_size"]  # dpo_config_file's beta, a step's pairs
MODEL = LlamaConfig(**{name: value for name, value in TINY["model"].items() if name != "type"})
SEQ_LEN = TINY["data"]["seq_len"]
# A reply's summed log-probability from another program: the forward pass, the vocabulary's log-softmax and
# the sum over the row's positions.
LOGP_TERMS = decoder_terms(MODEL, SEQ_LEN) + MODEL.vocab_size + SEQ_LEN


def assert_first_step_at_the_reference(first: dict) -> None:
    """Step 1 is computed with the weights the reference holds, so there is no margin yet and the loss is
    log 2, up to summation order: the policy's log-probabilities come from the step's program (under the
    gradient), the reference's from the one before it. Each pair's reward ``beta * (pi - ref)`` is within
    ``beta`` times `LOGP_TERMS` at the log-probability's size (negative, so the mean of the sizes is the size
    of the logged mean); the margins add the chosen's and the rejected's; -log sigmoid's slope at 0 is 1/2,
    then its own function's error and the mean over the pairs."""
    margin = BETA * sum(
        summation_tolerance(first[f"logps/{side}"], LOGP_TERMS + 2) for side in ("chosen", "rejected")
    )
    assert first["rewards/margins"] == pytest.approx(0.0, rel=0, abs=margin)
    loss = margin / 2 + summation_tolerance(math.log(2), FUNCTION_TERMS + PAIRS + 2)
    assert first["loss"] == pytest.approx(math.log(2), rel=0, abs=loss)


def preference_records(count: int, seed: int = 0) -> list[dict]:
    """Sums: the chosen reply agrees and is right, the rejected one refuses and is off by one to nine."""
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(count):
        a, b = (int(x) for x in rng.integers(0, 50, size=2))
        off = int(rng.integers(1, 10))
        records.append(
            {"prompt": f"{a} plus {b}?", "chosen": f"yes, {a + b}", "rejected": f"no, {a + b + off}"}
        )
    return records


@pytest.fixture(scope="module")
def dpo_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("dpo")
    records = preference_records(64)
    source = folder / "pairs.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in records))
    corpus = [f"<|user|>\n{r['prompt']}\n<|assistant|>\n{r['chosen']} {r['rejected']}\n" for r in records]
    return source, make_tokenizer(folder / "tokenizer.json", corpus)


def dpo_config_file(tmp_path: Path, dpo_files: tuple[Path, str], name: str, **sections: dict) -> Path:
    source, tokenizer = dpo_files
    data = {"builtin_corpus": None, "sources": [str(source)], "tokenizer": tokenizer, "format": "preference"}
    return write_config(
        tmp_path / f"{name}.yaml",
        tmp_path / name,
        tmp_path / f"{name}-cache",
        data={**data, **sections.pop("data", {})},
        optimizer={"learning_rate": 0.01, "schedule": {"type": "constant", "warmup": 0}},
        trainer={"steps": 8, "objective": "dpo", **sections.pop("trainer", {})},
        checkpoint={"every_steps": None},
        dpo={"beta": 0.5},
        **sections,
    )


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory: pytest.TempPathFactory, dpo_files) -> tuple[Path, Path]:
    """(config file, run directory) of an 8-step DPO run made by `halyard train`, validated at the end."""
    folder = tmp_path_factory.mktemp("dpo-run")
    path = dpo_config_file(
        folder, dpo_files, "run", data={"validation_fraction": 0.25}, trainer={"eval_batches": 2}
    )
    assert main(["train", "--config", str(path)]) == 0
    return path, folder / "run"


def test_a_dpo_run_through_the_cli_learns_the_preference(dpo_run) -> None:
    rows = logged(dpo_run[1])
    steps = [row for row in rows if "loss" in row]
    assert [row["step"] for row in steps] == list(range(1, 9))
    for row in steps:
        assert all(name in row for name in (*REWARD_METRICS, "logps/chosen", "logps/rejected")), sorted(row)
    first, last = steps[0], steps[-1]
    assert_first_step_at_the_reference(first)
    assert last["loss"] < first["loss"] - 0.05
    assert last["rewards/margins"] > 0.1 and last["rewards/accuracies"] > 0.6
    # The mean margin against the difference of the mean rewards: the pairs' sums in float32 at the sizes of
    # the rewards. Rewards may have either sign, but log-probabilities are negative: a side's mean |reward|
    # is at most beta (|mean pi| + |mean ref|), and the reference's mean is the policy's minus reward / beta.
    sizes = [
        BETA * (abs(last[f"logps/{side}"]) + abs(last[f"logps/{side}"] - last[f"rewards/{side}"] / BETA))
        for side in ("chosen", "rejected")
    ]
    assert last["rewards/margins"] == pytest.approx(
        last["rewards/chosen"] - last["rewards/rejected"],
        rel=0,
        abs=summation_tolerance(2 * sum(sizes), PAIRS + 1),
    )
    evaluated = [row for row in rows if "eval_loss" in row]
    assert len(evaluated) == 1 and evaluated[0]["eval_loss"] < math.log(2)
    assert {f"eval_{name}" for name in REWARD_METRICS} <= set(evaluated[0])


def test_the_reference_is_the_initial_weights_also_after_a_resume(dpo_run) -> None:
    path, run_dir = dpo_run
    trainer = Trainer(load_config(path, "--trainer.steps", "9"))
    with CheckpointManager(run_dir / "checkpoints") as manager:
        reference = trainer.setup.initial_model(manager)
        saved = trainer.restore_state().params
    fresh = jax.jit(trainer.setup.init_state)(jax.random.PRNGKey(trainer.config.trainer.seed)).params
    assert all(
        jax.tree.leaves(
            jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()), reference, fresh)
        )
    )
    assert any(
        jax.tree.leaves(jax.tree.map(lambda a, b: bool((np.asarray(a) != np.asarray(b)).any()), saved, fresh))
    )
    # The resumed step compares with the start of the run, not with the weights it resumed from.
    resumed = trainer.fit()
    assert resumed.history[0]["step"] == 9 and resumed.history[0]["rewards/margins"] > 0.1


def _error_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err
    assert raised.value.code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_bad_preference_input_is_one_line(tmp_path: Path, dpo_files, capsys) -> None:
    records = preference_records(5)
    del records[2]["chosen"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(record) + "\n" for record in records))
    path = dpo_config_file(tmp_path, dpo_files, "broken", data={"sources": [str(broken)]})
    err = _error_of(capsys, ["train", "--config", str(path)])
    assert f"{broken}:3: field 'chosen' not found" in err and "[run config: data.chosen_field]" in err
    path = dpo_config_file(tmp_path, dpo_files, "mismatch")
    err = _error_of(capsys, ["train", "--config", str(path), "--data.format", "prompt_completion"])
    assert "trainer.objective=dpo trains on preference pairs but data.format='prompt_completion'" in err
    err = _error_of(capsys, ["train", "--config", str(path), "--trainer.objective", "lm"])
    assert "data.format=preference holds pairs to compare" in err and "set trainer.objective=dpo" in err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--trainer.objective=ppo", "trainer.objective='ppo': use one of lm, dpo"),
        ("--dpo.beta=0", "dpo.beta=0.0: must be positive"),
        ("--dpo.label_smoothing=0.5", "dpo.label_smoothing=0.5: must be in [0, 0.5)"),
    ],
)
def test_bad_dpo_settings_name_the_key(tmp_path: Path, dpo_files, override: str, message: str) -> None:
    path = dpo_config_file(tmp_path, dpo_files, "settings")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path, override)
