"""Supervised fine-tuning examples: chat and prompt/completion records rendered into target/non-target text."""

from halyard.data.examples.formats import (
    EXAMPLE_KINDS,
    ROLES,
    ExampleError,
    ExampleFormat,
    Segments,
)
from halyard.data.examples.hf_template import render_with_template

__all__ = ["EXAMPLE_KINDS", "ROLES", "ExampleError", "ExampleFormat", "Segments", "render_with_template"]
