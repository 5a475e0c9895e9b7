"""`train --help` explains every key (type, default, meaning), each `type:` variant's keys once, no repeats."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import draccus
import pytest

from halyard.train.cli import train_main
from halyard.train.config.help import help_groups
from halyard.train.config.parse import config_help
from halyard.train.config.schema import (
    dataclass_in,
    field_types,
    is_choice_section,
    sequence_element_dataclass,
)
from halyard.train.run_config import TrainConfig


def _every_key(cls: type, prefix: str = "") -> set[str]:
    """Every key the config tree accepts, each `type:` variant's keys included (independent of help.py)."""
    keys: set[str] = set()
    for name, annotation in field_types(cls).items():
        section = dataclass_in(annotation) or sequence_element_dataclass(annotation)
        dotted = f"{prefix}{name}"
        if section is None:
            keys.add(dotted)
            continue
        if sequence_element_dataclass(annotation) is not None:
            keys.add(dotted)
            dotted += "[]"
        if is_choice_section(section):
            keys.add(f"{dotted}.type")
            for variant in typing.cast(Any, section).get_known_choices().values():
                keys |= _every_key(variant, f"{dotted}.")
        else:
            keys |= _every_key(section, f"{dotted}.")
    return keys


def test_every_key_has_a_type_a_default_and_a_meaning() -> None:
    entries = [entry for group in help_groups(TrainConfig) for entry in group.entries]
    assert {entry.key for entry in entries} == _every_key(TrainConfig)
    for entry in entries:
        assert entry.meaning.strip(), f"--{entry.key} has no meaning: document its field"
        assert entry.type and entry.default, entry


def test_help_shows_the_defaults_of_the_default_config() -> None:
    shown: dict[str, str] = {}  # the first group naming a key: the default type's (or the shared) one
    for group in help_groups(TrainConfig):
        for entry in group.entries:
            shown.setdefault(entry.key, entry.default)
    defaults = draccus.encode(TrainConfig())
    assert shown["model.type"] == "llama" and shown["model.hidden_size"] == str(
        defaults["model"]["hidden_size"]
    )
    assert shown["trainer.steps"] == "1000" and shown["data.sources"] == "[]"
    assert shown["model.remat"] == "save_dots (mixtral: none)"
    assert shown["trainer.mesh.data"] == "-1"


def test_help_lists_each_line_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        train_main(["--help"])
    assert raised.value.code == 0
    text = capsys.readouterr().out
    assert text.strip() == config_help(TrainConfig, prog="train").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    repeated = {line for line in lines if lines.count(line) > 1}
    assert not repeated, repeated
    assert "Config file for" not in text and len(lines) < 400  # 308 with rl, trainer.watch and trainer.spikes
    # A type extending another lists only what differs: mistral's window, not llama's vocab_size again.
    mistral = text.split("model, type: mistral:", 1)[1].split("\n\n", 1)[0]
    assert "sliding_window=4096" in mistral and "--model.vocab_size" not in mistral
    assert "--model.num_experts int = 8" in text.split("model, type: mixtral:", 1)[1].split("\n\n", 1)[0]


def test_a_field_documented_only_in_a_class_docstring_is_found() -> None:
    from halyard.train.config.meanings import field_meaning

    @dataclasses.dataclass
    class Example:
        """An example.

        Attributes:
            a, b: two numbers.
            c: a count; d: a name.
        """

        a: int = 0
        b: int = 0
        c: int = 0
        d: str = ""
        e: float = 0.0
        """Below the field."""

    assert field_meaning(Example, "b") == "two numbers."
    assert (field_meaning(Example, "c"), field_meaning(Example, "d")) == ("a count", "a name.")
    assert field_meaning(Example, "e") == "Below the field."
