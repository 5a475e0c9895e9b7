"""Reading tensors of a Hugging Face folder by name and by block, without loading whole files.

Safetensors files are memory-mapped; `WeightSource.read` copies only the requested block. Pickled
``pytorch_model.bin`` files are read only when the caller allows it, with ``torch.load(weights_only=True)``
(which refuses arbitrary objects), memory-mapped as well.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import safe_open

from halyard.export.errors import MissingHfFileError, PickleRefusedError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


class WeightSource(abc.ABC):
    """The tensors of a checkpoint: names and shapes without reading, blocks on demand.

    Attributes:
        description: the file(s) the tensors come from, for messages.
    """

    description: str

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """Every tensor name."""

    @abc.abstractmethod
    def shape(self, key: str) -> tuple[int, ...]:
        """The shape of tensor ``key`` (nothing is read)."""

    @abc.abstractmethod
    def read(self, key: str, slices: tuple[slice, ...]) -> np.ndarray:
        """The block ``slices`` (one per dimension) of tensor ``key`` as a numpy array of its own (not a view
        of a mapped file)."""

    @abc.abstractmethod
    def file_of(self, key: str) -> str:
        """The file holding ``key`` (for messages)."""


def _weight_map(index_path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as error:
        raise ValueError(f"{index_path} is not a weight index (no 'weight_map' object): {error}") from error
    missing = sorted({name for name in weight_map.values() if not (index_path.parent / name).exists()})
    if missing:
        raise FileNotFoundError(
            f"{index_path} lists shard file(s) {missing} that are not in {index_path.parent}"
        )
    return dict(weight_map)


class SafetensorsSource(WeightSource):
    """``model.safetensors``, or the shards listed by ``model.safetensors.index.json``."""

    def __init__(self, folder: Path) -> None:
        index = folder / SAFETENSORS_INDEX
        self._files: dict[str, Any] = {}
        if index.exists():
            self._file_of = _weight_map(index)
            self.description = str(index)
        else:
            self._file_of = {}
            self.description = str(folder / SAFETENSORS)
            for key in self._open(SAFETENSORS, folder).keys():  # noqa: SIM118 (safe_open is not a mapping)
                self._file_of[key] = SAFETENSORS
        self._folder = folder

    def _open(self, name: str, folder: Path | None = None) -> Any:
        if name not in self._files:
            self._files[name] = safe_open(str((folder or self._folder) / name), framework="np")
        return self._files[name]

    def keys(self) -> list[str]:
        return list(self._file_of)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._open(self._file_of[key]).get_slice(key).get_shape())

    def read(self, key: str, slices: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(self._open(self._file_of[key]).get_slice(key)[slices])

    def file_of(self, key: str) -> str:
        return str(self._folder / self._file_of[key])


class TorchPickleSource(WeightSource):
    """``pytorch_model.bin`` (or its shards), loaded with ``torch.load(weights_only=True, mmap=True)``."""

    def __init__(self, folder: Path) -> None:
        import torch  # only for explicitly allowed pickled checkpoints

        index = folder / PICKLE_INDEX
        names = sorted(set(_weight_map(index).values())) if index.exists() else [PICKLE]
        self.description = str(index if index.exists() else folder / PICKLE)
        self._tensors: dict[str, Any] = {}
        self._file_of: dict[str, str] = {}
        for name in names:
            state = torch.load(str(folder / name), map_location="cpu", weights_only=True, mmap=True)
            for key, tensor in state.items():
                self._tensors[key] = tensor
                self._file_of[key] = str(folder / name)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensors[key].shape)

    def read(self, key: str, slices: tuple[slice, ...]) -> np.ndarray:
        import torch

        block = self._tensors[key][slices]
        if block.dtype == torch.bfloat16:  # numpy has no bfloat16 view of a torch tensor
            return block.float().numpy().astype(ml_dtypes.bfloat16)
        return block.numpy().copy()  # not a view of the mapped file: a loaded model never changes with it

    def file_of(self, key: str) -> str:
        return self._file_of[key]


def _listing(folder: Path) -> str:
    names: Iterator[str] = (p.name for p in sorted(folder.iterdir()))
    return ", ".join(names) or "nothing"


def open_weights(folder: Path, *, allow_pickle: bool) -> WeightSource:
    """The weights of a Hugging Face folder: safetensors first, pickled ``.bin`` only when allowed.

    Args:
        folder: the model folder.
        allow_pickle: read ``pytorch_model.bin`` when no safetensors exist (``weights_only=True``).

    Raises:
        PickleRefusedError: only pickled weights exist and ``allow_pickle`` is False.
        FileNotFoundError: no weight file at all (the folder's listing is in the message).
    """
    if (folder / SAFETENSORS_INDEX).exists() or (folder / SAFETENSORS).exists():
        return SafetensorsSource(folder)
    if (folder / PICKLE_INDEX).exists() or (folder / PICKLE).exists():
        if not allow_pickle:
            raise PickleRefusedError(
                f"{folder} holds only pickled PyTorch weights ({PICKLE}); unpickling can run arbitrary code, "
                "so Halyard refuses it by default. Convert the folder to safetensors, or pass "
                "allow_pickle=True to load it with torch.load(weights_only=True) (needs torch)"
            )
        return TorchPickleSource(folder)
    raise MissingHfFileError(
        f"{folder} has no {SAFETENSORS}, {SAFETENSORS_INDEX}, {PICKLE} or {PICKLE_INDEX} (it holds: "
        f"{_listing(folder)})"
    )
