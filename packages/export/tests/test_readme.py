"""The README's Python blocks run, in order, in one namespace, on a tiny saved Llama folder; a ```text
block right after one is its output."""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from pathlib import Path

import pytest
import transformers
from hf_cases import save
from tokenizers import Tokenizer, models

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.DOTALL | re.MULTILINE)


def readme_examples() -> list[tuple[str, str | None]]:
    """(code, expected output or None) for every python block, indented ones (inside a list) dedented."""
    text = README.read_text()
    blocks = list(BLOCK.finditer(text))
    examples = []
    for block, following in zip(blocks, [*blocks[1:], None], strict=True):
        if block.group(2) != "python":
            continue
        output = following is not None and following.group(2) == "text"
        output = output and not text[block.end() : following.start()].strip()
        examples.append((textwrap.dedent(block.group(3)), following.group(3) if output else None))
    return examples


def printed(code: str, namespace: dict, name: str) -> str:
    """Exec ``code`` in ``namespace``; returns what it printed."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, name, "exec"), namespace)
    return output.getvalue()


def test_the_readme_blocks_import_shard_and_export_a_saved_llama(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save("llama_gqa_tied", tmp_path / "tiny-llama")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(94)}}  # the model's 97
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(
        str(tmp_path / "tiny-llama" / "tokenizer.json")
    )
    monkeypatch.chdir(tmp_path)
    examples = readme_examples()
    assert len(examples) == 3, "the export README has 3 Python blocks; update this test with it"
    namespace: dict = {"__name__": "readme"}
    for number, (code, expected) in enumerate(examples, start=1):
        shown = printed(code, namespace, f"README.md python block {number}")
        assert expected is None or shown == expected, f"README python block {number} printed:\n{shown}"
    assert namespace["model"] is not None
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert exported.config.vocab_size == 97
    assert (tmp_path / "out" / "tokenizer.json").exists()
