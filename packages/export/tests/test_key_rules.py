"""Each family's KeyRule (its ``hf.py`` spec) names every key the installed transformers reads for that
architecture.

A key transformers reads but the rule does not name would be ignored although it may change the logits;
this test fails when a transformers release starts reading a new key, so that someone decides it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import transformers
import transformers.masking_utils
import transformers.modeling_rope_utils

from halyard.models.hf import hf_families, hf_family

# Names the shared code reaches through `config.` that are methods or class attributes, not config.json keys.
NOT_KEYS = {"get_text_config", "default_theta", "json", "standardize_rope_params", "validate_rope"}
_READS = (
    re.compile(r"\b(?:self\.|effective_)?config\.([a-z][a-z_0-9]*)\b"),
    re.compile(r'getattr\((?:self\.)?(?:effective_)?config, "([a-z_0-9]+)"'),
)


def _reads(source: str) -> set[str]:
    return {name for pattern in _READS for name in pattern.findall(source)} - NOT_KEYS


@pytest.mark.parametrize("family", sorted(hf_families()))
def test_every_key_transformers_reads_is_decided(family: str) -> None:
    spec = hf_family(family)
    config_class = transformers.CONFIG_MAPPING[spec.model_type]
    model_class = getattr(transformers, spec.architecture)
    read = {field.name for field in dataclasses.fields(config_class)} | set(config_class.attribute_map)
    modeling = inspect.getsource(inspect.getmodule(model_class))  # type: ignore[arg-type]
    read |= _reads(modeling)
    # the shared code the modeling file calls (GPT-2 has learned positions: no rope utilities)
    for module in (transformers.masking_utils, transformers.modeling_rope_utils):
        if module.__name__.rsplit(".", 1)[1] in modeling:
            read |= _reads(inspect.getsource(module))
    undecided = sorted(read - spec.rule.recognised)
    assert not undecided, (
        f"transformers {transformers.__version__} reads {undecided} for {family}: add each to the family's "
        f"KeyRule in halyard/models/families/*/hf.py (implemented, fixed or no_effect)"
    )


def test_a_rule_leaves_unread_keys_to_be_ignored() -> None:
    rule = hf_family("llama").rule
    assert rule.check({"is_llama_config": True, "rope_interleaved": False}, strict=False) == [
        "is_llama_config"
    ]
