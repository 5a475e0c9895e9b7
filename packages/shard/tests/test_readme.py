"""The README's Python blocks run, in order, in one namespace; a ```text block right after one is its output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.DOTALL)


def _examples() -> list[tuple[str, str | None]]:
    """(code, expected output or None) for every python block."""
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in BLOCK.finditer(README.read_text())]
    examples = []
    for i, (language, body, _, end) in enumerate(blocks):
        if language != "python":
            continue
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        adjacent = (
            following is not None
            and following[0] == "text"
            and not README.read_text()[end : following[2]].strip()
        )
        examples.append((body, following[1] if adjacent else None))
    return examples


def test_readme_examples_run_and_print_what_they_show(devices8: list) -> None:
    examples = _examples()
    assert len(examples) >= 6
    namespace: dict = {"__name__": "readme"}
    for number, (code, expected) in enumerate(examples, start=1):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(code, f"README.md python block {number}", "exec"), namespace)
        if expected is not None:
            assert output.getvalue() == expected, (
                f"README python block {number} printed:\n{output.getvalue()}"
            )
