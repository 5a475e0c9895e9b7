"""The ``model:`` section of a run config: every family registered in halyard.models, chosen by ``type:``.

halyard.models keeps its config classes free of any config library; this module gives each one a
twin that is also a draccus choice, so ``model: {type: llama, num_layers: 4}`` decodes into a real
`LlamaConfig` (the twin subclasses it, so ``init``, ``num_params`` and the rest are the family's own).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import draccus

from halyard.models import config_class, registered_models


@dataclasses.dataclass(frozen=True)
class ModelSection(draccus.ChoiceRegistry):
    """Base of the ``model:`` section; ``type:`` names a family of `halyard.models.registered_models`."""


def _register_families() -> dict[str, type]:
    twins: dict[str, type] = {}
    for name in registered_models():
        family = config_class(name)
        twin = type(
            family.__name__, (family, ModelSection), {"__doc__": family.__doc__, "__module__": __name__}
        )
        twin = dataclasses.dataclass(frozen=True)(twin)
        ModelSection.register_subclass(name)(twin)
        twins[name] = twin
    return twins


MODEL_SECTIONS = _register_families()


def model_section(name: str, **fields: Any) -> Any:
    """The config twin of family ``name`` with ``fields`` set (for defaults in Python code)."""
    if name not in MODEL_SECTIONS:
        raise ValueError(f"Unknown model family {name!r}; known: {sorted(MODEL_SECTIONS)}")
    return MODEL_SECTIONS[name](**fields)
