"""``data.mixture`` in the run config: each source a data: section of its own, weights, a step schedule,
and one-line errors naming the key for every bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import parse_config
from halyard.train.data_assembly.data_section import check_data_section
from halyard.train.data_assembly.mixture_build import source_data_configs
from halyard.train.mixture.config import MixtureConfig, block_rows, mixture_sources, weight_schedule
from halyard.train.run_config import TrainConfig

MIXTURE = {
    "data": {
        "tokenizer": "tokenizer.json",
        "text_field": "body",
        "mixture": {
            "sources": {
                "web": {"sources": ["web/*.jsonl"]},
                "code": {"sources": ["code/*.parquet"], "text_field": "content", "seed": 3},
            },
            "weights": {"web": 0.7, "code": 0.3},
            "schedule": {3: {"web": 0.25, "code": 0.75}},
        },
    },
    "trainer": {"batch_size": 8},
}


def parse(tmp_path: Path, *overrides: str) -> TrainConfig:
    path = tmp_path / "mixture.yaml"
    path.write_text(yaml.safe_dump(MIXTURE, sort_keys=False))
    return parse_config(TrainConfig, ["--config", str(path), *overrides])


def test_each_source_is_a_data_section_over_the_shared_keys(tmp_path: Path) -> None:
    config = parse(tmp_path)
    sources = mixture_sources(config.data)
    assert list(sources) == ["web", "code"]
    assert sources["web"].sources == ["web/*.jsonl"] and sources["web"].text_field == "body"
    assert sources["code"].text_field == "content" and sources["code"].seed == 3
    assert {source.tokenizer for source in sources.values()} == {"tokenizer.json"}
    assert not any(source.mixture.sources for source in sources.values())
    assert weight_schedule(config.data.mixture) == [
        (0, {"web": 0.7, "code": 0.3}),
        (3, {"web": 0.25, "code": 0.75}),
    ]
    caches = source_data_configs(config.data, tmp_path / "run")
    assert caches["web"].cache_dir == str(tmp_path / "run" / "cache" / "web")
    own = source_data_configs(
        parse(tmp_path, "--data.mixture.sources.code.cache_dir=/elsewhere").data, tmp_path
    )
    assert own["code"].cache_dir == "/elsewhere" and own["web"].cache_dir == str(tmp_path / "cache" / "web")


def test_the_schedule_alone_can_give_the_step_0_weights(tmp_path: Path) -> None:
    path = tmp_path / "schedule.yaml"
    values = yaml.safe_load(yaml.safe_dump(MIXTURE, sort_keys=False))
    values["data"]["mixture"]["weights"] = {}
    values["data"]["mixture"]["schedule"] = {0: {"web": 1.0}, 5: {"code": 1.0}}
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    config = parse_config(TrainConfig, ["--config", str(path)])
    assert weight_schedule(config.data.mixture) == [(0, {"web": 1.0}), (5, {"code": 1.0})]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--data.mixture.schedule={3: {web: 0.5, cod: 0.5}}", "data.mixture.schedule.3.cod: no such source"),
        ("--data.mixture.weights={web: 0, code: 0}", "data.mixture.weights: the weights sum to 0"),
        (
            "--data.mixture.weights={web: -0.5}",
            "data.mixture.weights.web=-0.5: a weight is a finite number >= 0",
        ),
        (
            "--data.mixture.schedule={2: {web: 1}}",
            "data.mixture.schedule: steps must increase, got 2 after 3",
        ),
        ("--data.mixture.schedule={-1: {web: 1}}", "data.mixture.schedule.-1: a step is 0 or more"),
        (
            "--data.mixture.schedule={0: {web: 1}}",
            "data.mixture.schedule.0 and data.mixture.weights both give",
        ),
        ("--data.sources=[more.jsonl]", "data.mixture and data.sources are exclusive"),
        ("--data.builtin_corpus=python-stdlib", "data.mixture and data.builtin_corpus are exclusive"),
        (
            "--data.mixture.sources.web.seq_len=64",
            "data.mixture.sources.web.seq_len: set once for every source",
        ),
        ("--data.mixture.sources.web.text_fild=x", "data.mixture.sources.web.text_fild: not a data: key"),
        (
            "--data.mixture.sources.web.format=dialogue",
            "data.mixture.sources.web.format='dialogue': use one of",
        ),
        (
            "--data.mixture.sources.web.strict=maybe",
            "data.mixture.sources.web.strict: Couldn't parse 'maybe'",
        ),
        (
            "--data.mixture.sources.web.format=preference",
            "data.mixture.sources.web.format=preference: a mixture",
        ),
        (
            "--data.mixture.sources={a/b: {sources: [x]}}",
            "data.mixture.sources.a/b: a source name is letters",
        ),
        ("--data.mixture.block_size=16", "data.mixture.block_size=16: the change at data.mixture.schedule.3"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        parse(tmp_path, override)
    assert "\n" not in str(raised.value)


def test_no_weights_at_step_0_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "no-weights.yaml"
    values = yaml.safe_load(yaml.safe_dump(MIXTURE, sort_keys=False))
    del values["data"]["mixture"]["weights"]
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    with pytest.raises(
        ConfigError, match=re.escape("data.mixture.weights is empty: give each source its share")
    ):
        parse_config(TrainConfig, ["--config", str(path)])


def test_a_schedule_step_always_starts_a_block(tmp_path: Path) -> None:
    mixture = parse(tmp_path).data.mixture
    assert block_rows(mixture, 8) == 3 * 8  # 3 steps of 8 rows: the change at step 3 starts a block
    plain = parse(tmp_path, "--data.mixture.schedule={}").data.mixture
    assert plain.schedule == {3: {"web": 0.25, "code": 0.75}}  # an empty mapping merges into the file's
    assert block_rows(MixtureConfig(sources=mixture.sources, weights=mixture.weights), 8) == 256
    assert block_rows(MixtureConfig(sources=mixture.sources, weights=mixture.weights), 1000) == 1000
    long = MixtureConfig(sources=mixture.sources, weights=mixture.weights, schedule={1000: {"web": 1.0}})
    assert block_rows(long, 8) == 25 * 8  # the most steps up to 256 rows that divide 1000
    assert block_rows(parse(tmp_path, "--data.mixture.block_size=12").data.mixture, 8) == 12


def test_sources_are_checked_each_in_its_own_terms(tmp_path: Path) -> None:
    empty = parse(tmp_path, "--data.mixture.sources.code.sources=[]")
    with pytest.raises(ConfigError, match=re.escape("data.mixture.sources.code.sources is empty")):
        check_data_section(empty.data)
    corpus = parse(tmp_path, "--data.mixture.sources.code={sources: [], builtin_corpus: python-stdlib}")
    assert check_data_section(corpus.data) == "tokenizer.json"
    corpora = "{web: {sources: [], builtin_corpus: python-stdlib}, code: {sources: [], builtin_corpus: python-stdlib}}"
    untrained = parse(tmp_path, "--data.tokenizer=null", f"--data.mixture.sources={corpora}")
    message = "data.mixture.sources.web.builtin_corpus: every source of a mixture is read with one tokenizer"
    with pytest.raises(ConfigError, match=re.escape(message)):  # not a tokenizer trained on each corpus
        check_data_section(untrained.data)
