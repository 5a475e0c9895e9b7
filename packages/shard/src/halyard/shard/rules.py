"""Layout rules: ordered logical-axis -> mesh-axes candidates, and how one array's axes resolve.

A rule maps a logical axis name (``"embed"``) to candidates tried in order. A candidate is a tuple of
mesh axes the dimension is split over together (``("fsdp",)`` or ``("data", "fsdp")``); the empty tuple
``()`` means "replicate, stop looking". A candidate wins when the product of its mesh sizes divides the
dimension and none of its mesh axes is already used by another dimension of the same array. Rules are
applied in their order, so an earlier rule claims a mesh axis first: with ``batch`` before ``embed``, an
activation ``(batch, pos, embed)`` puts the batch on ``fsdp`` and leaves ``embed`` whole, while a weight
``(embed, mlp)`` (no batch) puts ``embed`` on ``fsdp``. Candidates whose mesh axes all have size 1 shard
nothing, so they are skipped in favour of the next one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from halyard.named import Axis

Candidate: TypeAlias = tuple[str, ...]
"""Mesh axes one dimension is split over together; ``()`` replicates."""
Rules: TypeAlias = tuple[tuple[str, tuple[Candidate, ...]], ...]
"""Normalized rules: ``((logical name, (candidate, ...)), ...)`` in priority order."""
RuleValue: TypeAlias = str | Sequence[str | Sequence[str]] | None
"""What a user may write for one rule: ``"fsdp"``, ``("tensor", "fsdp")`` (two fallbacks),
``(("data", "fsdp"),)`` (one candidate over two mesh axes), ``()`` or ``None`` (replicate)."""


def normalize_rules(rules: Mapping[str, RuleValue] | Sequence[tuple[str, RuleValue]]) -> Rules:
    """Rules in canonical form (a tuple of ``(name, candidates)``), keeping their order.

    Args:
        rules: a mapping or a sequence of pairs from logical axis name to its candidates (`RuleValue`).

    Raises:
        TypeError / ValueError: for a malformed rule, naming it; for a logical name given twice.
    """
    pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
    normalized: list[tuple[str, tuple[Candidate, ...]]] = []
    seen: set[str] = set()
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError(f"Layout rule {pair!r}: expected a (logical axis name, mesh axes) pair")
        name, value = pair
        if not isinstance(name, str) or not name:
            raise TypeError(f"Layout rule {pair!r}: the logical axis name must be a non-empty str")
        if name in seen:
            raise ValueError(f"Layout rules name the logical axis {name!r} twice; merge its candidates")
        seen.add(name)
        normalized.append((name, _candidates(name, value)))
    return tuple(normalized)


def _candidates(name: str, value: RuleValue) -> tuple[Candidate, ...]:
    if value is None:
        return ((),)
    if isinstance(value, str):
        return ((value,),)
    candidates: list[Candidate] = []
    for candidate in value:
        if isinstance(candidate, str):
            candidates.append((candidate,))
        elif isinstance(candidate, tuple | list) and all(isinstance(a, str) for a in candidate):
            if len(set(candidate)) != len(candidate):
                raise ValueError(f"Layout rule {name!r}: candidate {candidate!r} repeats a mesh axis")
            candidates.append(tuple(candidate))
        else:
            raise TypeError(
                f"Layout rule {name!r}: candidate {candidate!r} must be a mesh axis name or a tuple of them"
            )
    return tuple(candidates) or ((),)


@dataclass(frozen=True)
class DimPlacement:
    """Where one dimension of an array went.

    Attributes:
        axis: the array's `Axis`.
        mesh_axes: mesh axes it is split over (size-1 mesh axes left out); ``()`` when replicated.
        why: when replicated although a rule wanted it split, the reason (else "").
        wanted: whether some rule candidate would have split it (a mesh size above 1).
    """

    axis: Axis
    mesh_axes: tuple[str, ...]
    why: str = ""
    wanted: bool = False


def check_mesh_axes(rules: Rules, mesh_sizes: Mapping[str, int]) -> None:
    """Raise ValueError when a rule names a mesh axis the mesh does not have."""
    for name, candidates in rules:
        for candidate in candidates:
            for mesh_axis in candidate:
                if mesh_axis not in mesh_sizes:
                    raise ValueError(
                        f"Layout rule {name!r} names mesh axis {mesh_axis!r}, which the mesh does not have "
                        f"(its axes: {tuple(mesh_sizes)}). Fix the rule or build the mesh with MeshSpec"
                    )


def _effective(candidate: Candidate, mesh_sizes: Mapping[str, int]) -> tuple[str, ...]:
    return tuple(a for a in candidate if mesh_sizes[a] > 1)


def _describe(mesh_axes: Sequence[str], mesh_sizes: Mapping[str, int]) -> str:
    return "*".join(f"{a}={mesh_sizes[a]}" for a in mesh_axes)


def resolve(axes: Sequence[Axis], rules: Rules, mesh_sizes: Mapping[str, int]) -> tuple[DimPlacement, ...]:
    """Place each dimension of an array with axes ``axes`` on mesh axes (see the module docstring).

    Args:
        axes: the array's axes, in its order.
        rules: normalized rules (`normalize_rules`).
        mesh_sizes: ``{mesh axis: size}`` of the mesh.

    Raises:
        ValueError: when a rule names a mesh axis the mesh lacks.
    """
    check_mesh_axes(rules, mesh_sizes)
    by_name = {axis.name: i for i, axis in enumerate(axes)}
    placed: dict[int, DimPlacement] = {}
    used: dict[str, str] = {}  # mesh axis -> the logical axis that took it
    for name, candidates in rules:
        if name not in by_name:
            continue
        index = by_name[name]
        axis = axes[index]
        reasons: list[str] = []
        wanted = False
        choice: tuple[str, ...] = ()
        for candidate in candidates:
            if candidate == ():
                break
            mesh_axes = _effective(candidate, mesh_sizes)
            if not mesh_axes:
                continue
            wanted = True
            taken = [a for a in mesh_axes if a in used]
            total = math.prod(mesh_sizes[a] for a in mesh_axes)
            if taken:
                continue  # the mesh axis splits another dimension of this array: nothing to report
            if axis.size % total:
                reasons.append(f"{name}={axis.size} does not divide over {_describe(mesh_axes, mesh_sizes)}")
            else:
                choice = mesh_axes
                break
        used.update(dict.fromkeys(choice, name))
        placed[index] = DimPlacement(axis, choice, "" if choice else "; ".join(reasons), wanted)
    return tuple(placed.get(i, DimPlacement(axis, ())) for i, axis in enumerate(axes))


def preferred_mesh_axes(name: str, rules: Rules, mesh_sizes: Mapping[str, int]) -> tuple[str, ...]:
    """The mesh axes a dimension called ``name`` is meant to be split over: the first candidate that
    shards anything on this mesh (size-1 mesh axes left out), regardless of divisibility; ``()`` if none.

    Raises:
        ValueError: when a rule names a mesh axis the mesh lacks.
    """
    check_mesh_axes(rules, mesh_sizes)
    for rule_name, candidates in rules:
        if rule_name != name:
            continue
        for candidate in candidates:
            if candidate == ():
                return ()
            mesh_axes = _effective(candidate, mesh_sizes)
            if mesh_axes:
                return mesh_axes
    return ()
