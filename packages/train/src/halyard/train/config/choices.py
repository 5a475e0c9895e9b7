"""Sections picked by ``type:``: a base dataclass and the subclasses registered under a name.

    @choice_section
    @dataclass(frozen=True)
    class ScheduleConfig: ...

    @register(ScheduleConfig, "cosine")
    @dataclass(frozen=True)
    class CosineScheduleConfig(ScheduleConfig): ...

`choice_section` gives the base the four classmethods of the choice protocol the config library reads
(draccus's ``ChoiceType``: `get_choice_class`, `get_known_choices`, `get_choice_name`,
`default_choice_name`), so a module defining a section needs no config library: ``import
halyard.train.optim`` works without draccus. `halyard.models.ModelConfig` answers the same protocol from its
family registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


REGISTRY_ATTRIBUTE = "_halyard_choices"


def choice_section(base: type[T]) -> type[T]:
    """Make ``base`` a section whose ``type:`` names one of its subclasses registered with `register`: adds
    the choice protocol's classmethods."""
    registry: dict[str, type] = {}
    setattr(base, REGISTRY_ATTRIBUTE, registry)

    def get_choice_class(cls: type, name: str) -> type:
        return registry[name]

    def get_known_choices(cls: type) -> dict[str, type]:
        return dict(registry)

    def get_choice_name(cls: type, subclass: type) -> str:
        for name, registered in registry.items():
            if registered is subclass:
                return name
        raise ValueError(f"{subclass.__name__} is not a registered {base.__name__} type")

    def default_choice_name(cls: type) -> str | None:
        return None

    for function in (get_choice_class, get_known_choices, get_choice_name, default_choice_name):
        setattr(base, function.__name__, classmethod(function))
    return base


def register(base: type, name: str) -> Callable[[type[T]], type[T]]:
    """A class decorator registering a subclass of the `choice_section` ``base`` as ``type: name``.

    Raises:
        ValueError: ``name`` is registered to another class.
    """
    registry: dict[str, type] = getattr(base, REGISTRY_ATTRIBUTE)

    def add(subclass: type[T]) -> type[T]:
        if registry.get(name, subclass) is not subclass:
            raise ValueError(f"{name!r} is registered to {registry[name].__name__} already")
        registry[name] = subclass
        return subclass

    return add
