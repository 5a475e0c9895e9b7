"""The ``data:`` section's example keys are `halyard.data.ExampleFormat`'s fields: the same names (``format``
for ``kind``) and the same defaults, so a field added to the format cannot be silently missing from runs."""

from __future__ import annotations

import dataclasses

from halyard.data import ExampleFormat
from halyard.train.data_assembly.data_section import (
    EXAMPLE_FORMAT_KEYS,
    EXAMPLE_FORMAT_ONLY,
    example_format_of,
)
from halyard.train.run_config import DataConfig


def test_every_example_format_field_is_a_data_key_with_its_default() -> None:
    data_defaults = {field.name: field.default for field in dataclasses.fields(DataConfig)}
    for field in dataclasses.fields(ExampleFormat):
        if field.name in EXAMPLE_FORMAT_ONLY:
            continue
        key = EXAMPLE_FORMAT_KEYS.get(field.name, field.name)
        assert key in data_defaults, f"ExampleFormat.{field.name} has no data.{key} key"
        assert data_defaults[key] == field.default, (
            f"data.{key} defaults to {data_defaults[key]!r}, not {field.default!r}"
        )


def test_the_data_section_becomes_the_example_format() -> None:
    data = DataConfig(format="chat", messages_field="turns", end_of_turn="<end>\n", chat_template="auto")
    assert example_format_of(data) == ExampleFormat(
        kind="chat", messages_field="turns", end_of_turn="<end>\n", chat_template="auto"
    )
