"""The README's python code blocks run as written (in order, sharing one namespace)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_a_quick_start():
    assert python_blocks(), f"{README} has no ```python blocks"


def test_readme_python_blocks_run():
    namespace: dict = {"__name__": "readme"}
    for number, block in enumerate(python_blocks()):
        exec(compile(block, f"{README}:python-block-{number}", "exec"), namespace)
