"""Building from a script: an unguarded top-level build fails with the fix instead of hanging, and the
progress bar reports the build's speed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from data_helpers import make_documents, write_jsonl_shards

from halyard.data import build_cache

SCRIPT = """
from halyard.data import build_cache

{indent}cache = build_cache("data/*.jsonl", "tokenizer.json", "cache", num_workers=2, progress=False)
{indent}print("documents:", cache.num_documents)
"""


def _run_script(folder: Path, guarded: bool) -> subprocess.CompletedProcess:
    body = SCRIPT.format(indent="    " if guarded else "")
    if guarded:
        body = body.replace("\n    cache =", "\nif __name__ == '__main__':\n    cache =", 1)
    (folder / "build.py").write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "build.py"], cwd=folder, capture_output=True, text=True, timeout=180
    )


@pytest.fixture
def script_folder(tmp_path: Path, tokenizer_path: str) -> Path:
    write_jsonl_shards(tmp_path / "data", make_documents(40, seed=3), num_shards=2)
    (tmp_path / "tokenizer.json").write_text(Path(tokenizer_path).read_text())
    return tmp_path


def test_an_unguarded_script_fails_naming_the_guard_instead_of_waiting_forever(script_folder: Path) -> None:
    completed = _run_script(script_folder, guarded=False)
    assert completed.returncode != 0
    assert "if __name__ == '__main__':" in completed.stderr
    assert "waiting for it to finish" not in completed.stderr


BACKGROUND_SCRIPT = """
from halyard.data import build_cache

handle = build_cache("data/*.jsonl", "tokenizer.json", "cache", num_workers=2, progress=False, background=True)
handle.cache.wait_for_tokens(10**9)
"""


def _large_tokenizer(path: Path) -> None:
    """A word-level tokenizer of 30,000 words: megabytes of pickled state, more than a pipe's buffer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {"[UNK]": 0, "<|endoftext|>": 1, **{f"word{index}": index + 2 for index in range(30_000)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


@pytest.mark.parametrize("mode", ["foreground", "background"])
def test_an_unguarded_script_with_a_large_tokenizer_fails_instead_of_waiting_forever(
    script_folder: Path, mode: str
) -> None:
    # The tokenizer reaches the workers through a file: through the spawn pipe, the parent would block
    # writing it to a worker that died importing the script (the reader of a background build with it).
    _large_tokenizer(script_folder / "tokenizer.json")
    assert (script_folder / "tokenizer.json").stat().st_size > 4 * 65536
    if mode == "foreground":
        completed = _run_script(script_folder, guarded=False)
    else:
        (script_folder / "build.py").write_text(BACKGROUND_SCRIPT)
        completed = subprocess.run(
            [sys.executable, "build.py"], cwd=script_folder, capture_output=True, text=True, timeout=180
        )
    assert completed.returncode != 0
    assert "if __name__ == '__main__':" in completed.stderr
    assert "a builder worker process died" in completed.stderr


def test_a_guarded_script_builds(script_folder: Path) -> None:
    completed = _run_script(script_folder, guarded=True)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "documents: 40" in completed.stdout


def test_a_script_read_from_standard_input_builds_in_its_own_process(script_folder: Path) -> None:
    # `python - <<EOF`: no file for the workers to import the script from (their start would fail).
    script = textwrap.dedent(SCRIPT.format(indent="    ")).replace(
        "\n    cache =", "\nif __name__ == '__main__':\n    cache ="
    )
    completed = subprocess.run(
        [sys.executable, "-"], input=script, cwd=script_folder, capture_output=True, text=True, timeout=180
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "documents: 40" in completed.stdout and "Traceback" not in completed.stderr
    notes = [line for line in completed.stderr.splitlines() if "standard input" in line]
    assert notes == [
        "halyard.data: the main script was read from standard input (<stdin>), which builder worker processes "
        "cannot import: tokenizing in this process instead"
    ], completed.stderr


def test_the_progress_bar_ends_with_the_builds_tokens_per_second(
    tmp_path: Path, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl_shards(tmp_path / "data", make_documents(60, seed=4), num_shards=1)
    build_cache(str(tmp_path / "data" / "*.jsonl"), tokenizer_path, str(tmp_path / "cache"), num_workers=0)
    speeds = [int(value) for value in re.findall(r"tokens_per_s=(\d+)", capsys.readouterr().err)]
    assert speeds and speeds[-1] > 0


def _readme_block(heading: str) -> str:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[0]


def test_the_readme_fine_tuning_block_runs_as_a_script(tmp_path: Path, tokenizer_path: str) -> None:
    (tmp_path / "sft").mkdir()
    chats = [
        {
            "conversation": [
                {"role": "user", "content": f"add {i} and 1"},
                {"role": "assistant", "content": str(i + 1)},
            ]
        }
        for i in range(40)
    ]
    (tmp_path / "sft" / "chats.jsonl").write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    (tmp_path / "tokenizer.json").write_text(Path(tokenizer_path).read_text())
    (tmp_path / "script.py").write_text(
        _readme_block("Supervised fine-tuning examples").replace("2048", "16")
    )
    completed = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "(8, 17)" in completed.stdout
