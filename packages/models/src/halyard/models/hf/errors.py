"""The errors of reading a Hugging Face config (`halyard.export` raises these and more, all subclasses of
`HfConversionError`)."""

from __future__ import annotations


class HfConversionError(ValueError):
    """Base class: a Hugging Face folder or a Halyard model cannot be converted as asked."""


class UnsupportedModelError(HfConversionError):
    """The architecture, a config option or its value has no Halyard (or Hugging Face) equivalent."""
