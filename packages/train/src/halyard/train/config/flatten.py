"""A config as a flat `{"dotted.key": value}` dict, the form trackers store hyperparameters in."""

from __future__ import annotations

from typing import Any

import draccus


def flatten_config(config: Any) -> dict[str, Any]:
    """Flatten a config dataclass into dotted keys (`{"optimizer.type": "adamw", "trainer.steps": 100}`).

    Args:
        config: a config dataclass instance (choice sections contribute their `type`).
    """
    flat: dict[str, Any] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, child in value.items():
                visit(f"{prefix}{key}.", child)
        else:
            flat[prefix.rstrip(".")] = value

    visit("", draccus.encode(config))
    return flat
