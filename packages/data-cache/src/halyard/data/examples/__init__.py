"""Fine-tuning examples: chat, prompt/completion and preference records rendered into target/non-target text."""

from halyard.data.examples.formats import EXAMPLE_KINDS, ExampleError, ExampleFormat
from halyard.data.examples.hf_template import render_prompt_with_template, render_with_template
from halyard.data.examples.messages import ROLES, Segments

__all__ = [
    "EXAMPLE_KINDS",
    "ROLES",
    "ExampleError",
    "ExampleFormat",
    "Segments",
    "render_prompt_with_template",
    "render_with_template",
]
