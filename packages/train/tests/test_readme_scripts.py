"""The train README's Python block runs as a script, as a user runs it: the token cache's spawn workers
import the script again, so the guarded block trains and an unguarded copy fails naming the guard
(it used to wait forever for its own cache build). The optim README's block runs too."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from matrix_cells import CELLS, write_cell_config

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, "the train README has one Python block; update this test with it"
    return blocks[0].replace('"100"', '"3"')  # the block's 100 steps, shortened


def unguarded(block: str) -> str:
    head, _, body = block.partition('if __name__ == "__main__":')
    return head + textwrap.dedent(body.split("\n", 1)[1])


@pytest.mark.parametrize("guarded", [True, False], ids=["as-written", "without-the-guard"])
def test_the_readme_training_block_as_a_script(guarded: bool, tmp_path: Path) -> None:
    values = CELLS[1].config(tmp_path / "run", tmp_path / "cache")
    del values["data"]["num_workers"]  # the default: a pool of spawned build workers
    write_cell_config(tmp_path / "my_run.yaml", values)
    block = readme_block()
    (tmp_path / "script.py").write_text(block if guarded else unguarded(block))
    completed = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    if guarded:
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert (tmp_path / "run" / "checkpoints").is_dir()
    else:
        assert completed.returncode != 0
        assert "if __name__ == '__main__':" in completed.stderr, completed.stderr[-3000:]


def test_the_optim_readme_block_runs() -> None:
    readme = README.parent / "src" / "halyard" / "train" / "optim" / "README.md"
    (block,) = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(block, str(readme), "exec"), namespace)
    assert (
        float(namespace["loss"](namespace["params"], namespace["batch"])) < 9.0
    )  # 9 at w = 1, before the step
