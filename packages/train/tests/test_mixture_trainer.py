"""Training on ``data.mixture``: a cache per source, the schedule followed row by row, per-source training
and validation losses, resuming across a schedule change bitwise, and changed weights refused or allowed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from float_tolerance import decoder_terms, summation_tolerance, training_terms
from test_sft_trainer import make_tokenizer
from trainer_fixtures import (
    TINY,
    StopAfter,
    assert_bitwise_equal,
    deep_update,
    load_config,
    start_processes,
    write_config,
)

from halyard.data import LMDataset
from halyard.models import LlamaConfig
from halyard.train.commands.evaluate import eval_main
from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.mixture_batches import SourceMixture
from halyard.train.data_assembly.run_data import prepare_data
from halyard.train.objectives.lm_evaluate import Evaluator
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.plan.step_memory import step_memory
from halyard.train.run.loading import load_run_config
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.trainer import FitResult, Trainer

WEIGHTS = {"web": 0.75, "code": 0.25}
LATER = {"web": 0.25, "code": 0.75}  # from step 3 on
ROWS, SEQ_LEN = 8, 16  # a step's batch: TINY's batch_size, mixture_config's seq_len
# One training step over other meshes or processes: the forward and backward's sums, the cross-entropy's sum
# over the vocabulary and the batch's tokens. A step's loss carries every earlier update's differences: the
# bound grows by this much per update behind it (as trainer_fixtures.assert_trajectory_close's).
MODEL = LlamaConfig(**{name: value for name, value in TINY["model"].items() if name != "type"})
STEP_TERMS = training_terms(MODEL, ROWS, SEQ_LEN) + MODEL.vocab_size


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two jsonl sources with different text keys, and a tokenizer for both."""
    folder = tmp_path_factory.mktemp("mixture-data")
    rng = np.random.default_rng(0)
    words = ["the", "ship", "sails", "at", "dawn", "with", "rope", "and", "mast", "under", "wind"]
    web = [" ".join(rng.choice(words, size=12)) for _ in range(80)]
    code = [f"def f{i}(x):\n    return x * {i % 9} + {i % 5}\n" for i in range(80)]
    for half in range(2):  # two shards a source: two hosts build a share of each
        (folder / f"web-{half}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in web[half::2])
        )
        (folder / f"code-{half}.jsonl").write_text(
            "".join(json.dumps({"content": t}) + "\n" for t in code[half::2])
        )
    tokenizer = make_tokenizer(folder / "tokenizer.json", web + code)
    return {"folder": folder, "tokenizer": tokenizer, "cache": folder / "caches"}


def mixture_config(tmp_path: Path, sources: dict[str, Any], name: str, **sections: Any) -> TrainConfig:
    folder = sources["folder"]
    data = {
        "builtin_corpus": None,
        "tokenizer": sources["tokenizer"],
        "seq_len": 16,
        "validation_fraction": 0.1,
        "mixture": {
            "sources": {
                "web": {"sources": [str(folder / "web-*.jsonl")]},
                "code": {"sources": [str(folder / "code-*.jsonl")], "text_field": "content"},
            },
            "weights": WEIGHTS,
            "schedule": {3: LATER},
        },
    }
    trainer = {"steps": 6, "eval_batches": 1, **sections.pop("trainer", {})}
    data = deep_update(data, sections.pop("data", {}))
    path = write_config(
        tmp_path / f"{name}.yaml", tmp_path / name, sources["cache"], data=data, trainer=trainer
    )
    return load_config(path, *sections.pop("overrides", ()))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, Any]) -> dict[str, Any]:
    """The 6-step mixture run whole, and stopped after step 3 (the schedule's change) and resumed."""
    tmp_path = tmp_path_factory.mktemp("mixture-runs")
    whole = mixture_config(tmp_path, sources, "whole")
    split = mixture_config(tmp_path, sources, "split")
    with pytest.raises(SystemExit):
        Trainer(split, preemption=StopAfter(3)).fit()
    stopped_at = int(Trainer(split).restore_state().step)
    return {
        "tmp": tmp_path,
        "config": whole,
        "whole": Trainer(whole).fit(),
        "stopped_at": stopped_at,
        "resumed": Trainer(split).fit(),
    }


def test_every_source_has_its_own_cache_and_the_rows_follow_the_schedule(runs: dict[str, Any]) -> None:
    config: TrainConfig = runs["config"]
    for name in ("web", "code"):
        assert (Path(config.data.cache_dir or "") / name / "tokens").is_dir()
    data = prepare_data(config.data, Path(config.trainer.run_dir), progress=False)
    assert isinstance(data.train, SourceMixture) and data.train.names == ["code", "web"]
    # Blocks of 3 steps x 8 rows: each block holds exactly each source's share.
    for first_step, weights in ((0, WEIGHTS), (3, LATER)):
        rows = [data.train.batch(step, 8) for step in range(first_step, first_step + 3)]
        one_hot = np.concatenate([batch["source_one_hot"] for batch in rows])
        assert one_hot.sum(axis=0).tolist() == [24 * weights["code"], 24 * weights["web"]]
        assert (one_hot.argmax(axis=1) == np.concatenate([batch["source"] for batch in rows])).all()


def test_resuming_exactly_at_the_schedule_change_gives_the_same_bits(runs: dict[str, Any]) -> None:
    whole: FitResult = runs["whole"]
    resumed: FitResult = runs["resumed"]
    assert runs["stopped_at"] == 3 and int(resumed.state.step) == 6
    assert_bitwise_equal(whole.state.params, resumed.state.params)
    assert_bitwise_equal(whole.state.opt_state, resumed.state.opt_state)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history][3:]


def test_training_losses_by_source_add_up_to_the_loss(runs: dict[str, Any]) -> None:
    seen = {"web": 0.0, "code": 0.0}
    for record in runs["whole"].history:
        tokens = {name: record[f"train/{name}/tokens"] for name in seen}
        assert sum(tokens.values()) == record["num_tokens"]
        present = [name for name in seen if tokens[name] > 0]
        weighted = sum(record[f"train/{name}/loss"] * tokens[name] for name in present) / record["num_tokens"]
        # the same tokens' losses, summed by source, then weighted: sums of the batch's tokens in another order
        assert weighted == pytest.approx(
            record["loss"], rel=0, abs=summation_tolerance(record["loss"], ROWS * SEQ_LEN + 2)
        )
        # A step without rows of a source (a block spans 3 steps) has no loss for it.
        assert all(np.isnan(record[f"train/{name}/loss"]) for name in seen if name not in present)
        seen = {name: seen[name] + tokens[name] for name in seen}
    assert seen["web"] > seen["code"] > 0
    logged = [json.loads(line) for line in (Path(runs["config"].trainer.run_dir) / "metrics.jsonl").open()]
    assert "train/code/loss" in logged[0] and "data/code/build_tokens" in logged[0]


def test_the_loss_split_by_source_leaves_the_loss_as_it_was(runs: dict[str, Any]) -> None:
    config: TrainConfig = runs["config"]
    data = prepare_data(config.data, Path(config.trainer.run_dir), progress=False)
    batch = data.train.batch(4, 8)
    model = runs["whole"].state.params
    loss_fn = jax.jit(lm_loss_fn())
    key = jax.random.PRNGKey(0)
    split_sum, stats = loss_fn(model, batch, key)
    # The reference: the plain loss (no sources), over every row, then over one source's rows at a time.
    plain = {name: batch[name] for name in ("tokens", "segment_ids")}
    every_row = np.ones_like(batch["tokens"])
    plain_sum, plain_stats = loss_fn(model, {**plain, "loss_mask": every_row}, key)
    # other programs (with and without the split): the forward, the vocabulary's and the 4 x 8 tokens' sums
    terms = decoder_terms(MODEL, 8) + MODEL.vocab_size + 4 * 8
    assert float(split_sum) == pytest.approx(
        float(plain_sum), rel=0, abs=summation_tolerance(plain_sum, terms)
    )
    assert float(stats["num_tokens"]) == float(plain_stats["num_tokens"])
    for index in range(2):
        rows = every_row * (batch["source"] == index)[:, None]
        alone, alone_stats = loss_fn(model, {**plain, "loss_mask": rows}, key)
        bound = summation_tolerance(alone, terms)
        assert float(stats["source_loss"][index]) == pytest.approx(float(alone), rel=0, abs=bound)
        assert float(stats["source_tokens"][index]) == float(alone_stats["num_tokens"])


def test_each_source_is_validated_on_its_own(runs: dict[str, Any]) -> None:
    config: TrainConfig = runs["config"]
    last = runs["whole"].last_metrics
    data = prepare_data(config.data, Path(config.trainer.run_dir), progress=False)
    assert isinstance(data.validation, dict) and sorted(data.validation) == ["code", "web"]
    trainer = Trainer(config)
    for name, split in data.validation.items():
        assert isinstance(split, LMDataset) and split.split.split == "validation"
        alone, _ = Evaluator(split, config, trainer.mesh, trainer.layout, data.tokenizer_path).evaluate(
            runs["whole"].state.params
        )
        # the same program on the same weights: an Evaluator of the run's config, mesh and layout
        assert last[f"eval/{name}/loss"] == alone["eval_loss"]
        assert last[f"eval/{name}/bits_per_byte"] == alone["eval_bits_per_byte"]
    losses = sorted(last[f"eval/{name}/loss"] for name in ("web", "code"))
    assert losses[0] <= last["eval_loss"] <= losses[1]


def test_per_source_losses_are_the_same_on_an_fsdp_mesh(
    runs: dict[str, Any], sources: dict[str, Any]
) -> None:
    """The whole run on 8 devices with FSDP (weights sharded, the rows over the fsdp axis): each source's
    training and validation losses are the data-parallel run's."""
    fsdp = {"trainer": {"layout": "fsdp", "min_shard": 1, "mesh": {"data": 1, "fsdp": 8}}}
    result = Trainer(mixture_config(runs["tmp"], sources, "fsdp", **fsdp)).fit()
    whole: FitResult = runs["whole"]
    for updates, (got, expected) in enumerate(zip(result.history, whole.history, strict=True)):
        for key in ("loss", "train/web/loss", "train/code/loss", "train/web/tokens"):
            terms = (updates + 1) * STEP_TERMS  # this step's sums and those of the updates behind it
            bound = summation_tolerance(np.nan_to_num(expected[key]), terms)  # NaN where no rows
            np.testing.assert_allclose(got[key], expected[key], atol=bound, rtol=0, err_msg=key)
    for key in (
        "eval_loss",
        "eval/web/loss",
        "eval/code/loss",
        "eval/web/bits_per_byte",
        "eval/code/bits_per_byte",
    ):
        updates = len(whole.history)  # the evaluation's forward after all the run's updates
        bound = summation_tolerance(whole.last_metrics[key], (updates + 1) * STEP_TERMS)
        assert result.last_metrics[key] == pytest.approx(whole.last_metrics[key], rel=0, abs=bound), key


def test_the_saved_config_reads_back_and_halyard_eval_splits_by_source(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config: TrainConfig = runs["config"]
    assert load_run_config(config.trainer.run_dir).data == config.data
    capsys.readouterr()
    assert eval_main(["--run", config.trainer.run_dir]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("eval_loss", "eval/web/loss", "eval/code/bits_per_byte"):
        # the same program on the same weights: the last checkpoint on the run's mesh and layout
        assert printed[key] == runs["whole"].last_metrics[key]


def test_changed_weights_are_refused_on_resume_unless_allowed(
    runs: dict[str, Any], sources: dict[str, Any]
) -> None:
    tmp_path: Path = runs["tmp"]
    changed = {"data": {"mixture": {"weights": {"web": 0.5, "code": 0.5}}}, "trainer": {"steps": 8}}
    refused = mixture_config(tmp_path, sources, "split", **changed)
    message = "data.mixture.weights: {code: 0.25, web: 0.75} -> {code: 0.5, web: 0.5} since the checkpoint at step 6"
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        Trainer(refused).fit()
    assert "\n" not in str(raised.value) and "data.allow_mixture_change: true" in str(raised.value)
    schedule = {"data": {"mixture": {"schedule": {3: LATER, 7: WEIGHTS}}}, "trainer": {"steps": 8}}
    with pytest.raises(
        ConfigError, match=re.escape("data.mixture.schedule: {3: {code: 0.75, web: 0.25}} -> {3:")
    ):
        Trainer(mixture_config(tmp_path, sources, "split", **schedule)).fit()
    # Allowed: two copies of the run go on with the new weights from step 6, to the same bits.
    results = []
    for copy in ("allowed-a", "allowed-b"):
        shutil.copytree(tmp_path / "split", tmp_path / copy)
        allowed = mixture_config(
            tmp_path, sources, copy, **changed, overrides=["--data.allow_mixture_change=true"]
        )
        results.append(Trainer(allowed).fit())
    assert [int(result.state.step) for result in results] == [8, 8]
    assert_bitwise_equal(results[0].state.params, results[1].state.params)
    assert results[0].history[0]["step"] == 7


def test_a_bad_source_is_named_by_its_key(tmp_path: Path, sources: dict[str, Any]) -> None:
    missing = {"data": {"mixture": {"sources": {"code": {"sources": [str(tmp_path / "nowhere.jsonl")]}}}}}
    config = mixture_config(tmp_path, sources, "missing", **missing)
    with pytest.raises(
        ConfigError, match=re.escape("[run config: data.mixture.sources.code.sources]")
    ) as raised:
        Trainer(config).fit()
    assert "\n" not in str(raised.value)


def test_halyard_plan_compiles_the_mixture_step(runs: dict[str, Any]) -> None:
    config: TrainConfig = runs["config"]
    plan = step_memory(config, jax.devices()[:1])
    rows, width = config.trainer.batch_size, config.data.seq_len + 1
    assert plan.batch == 4 * (2 * rows * width + rows * 2)  # tokens, segment ids and the one-hot sources


@pytest.mark.multiprocess
def test_two_processes_build_a_share_of_every_source_and_train_like_one(
    runs: dict[str, Any], sources: dict[str, Any]
) -> None:
    """2 processes x 2 devices, a fresh cache: each host tokenizes one shard of each source, and the run's
    losses (also by source) are the 8-device single-process run's."""
    tmp_path: Path = runs["tmp"]
    fresh = {"data": {"cache_dir": str(tmp_path / "two-hosts-caches")}}
    mixture_config(tmp_path, sources, "two-hosts", **fresh)
    processes = start_processes(["--config", str(tmp_path / "two-hosts.yaml")])
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
    for stdout, _ in outputs:  # each process's share: 1 of the 2 shards, for each of the 2 sources
        assert stdout.count("(1 of 2 shards on this process)") == 2, stdout[-2000:]
    logged = [json.loads(line) for line in (tmp_path / "two-hosts" / "metrics.jsonl").open()]
    by_step = {record["step"]: record for record in logged if "loss" in record}
    for updates, expected in enumerate(runs["whole"].history):
        got = by_step[expected["step"]]
        for key in ("loss", "train/web/loss", "train/code/loss", "train/web/tokens"):
            # this step's sums and those of the updates behind it, as on the FSDP mesh above
            bound = summation_tolerance(np.nan_to_num(expected[key]), (updates + 1) * STEP_TERMS)
            np.testing.assert_allclose(
                float(got[key]), expected[key], atol=bound, rtol=0, err_msg=key
            )  # "NaN"
    evaluated = [record for record in logged if "eval_loss" in record][-1]
    for key in ("eval_loss", "eval/web/loss", "eval/code/loss", "eval/web/bits_per_byte"):
        expected = runs["whole"].last_metrics[key]
        bound = summation_tolerance(expected, (len(runs["whole"].history) + 1) * STEP_TERMS)
        np.testing.assert_allclose(evaluated[key], expected, atol=bound, rtol=0, err_msg=key)
