"""The errors import and export raise; each message names the file, key or option and the fix."""

from __future__ import annotations

from halyard.models.hf.errors import HfConversionError, UnsupportedModelError

__all__ = [
    "HfConversionError",
    "MissingHfFileError",
    "MissingWeightError",
    "PickleRefusedError",
    "ShapeMismatchError",
    "UnexpectedWeightError",
    "UnsupportedModelError",
]


class MissingHfFileError(HfConversionError, FileNotFoundError):
    """A Hugging Face folder without a file it needs (config.json, the weights); the message names it."""


class MissingWeightError(HfConversionError, KeyError):
    """A tensor the config implies is absent from the weight files."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnexpectedWeightError(HfConversionError):
    """The weight files hold a tensor the config does not explain (nothing is silently dropped)."""


class ShapeMismatchError(HfConversionError):
    """A tensor's shape differs from the one the config implies."""


class PickleRefusedError(HfConversionError):
    """Only pickled ``pytorch_model.bin`` weights exist and ``allow_pickle`` was not given."""
