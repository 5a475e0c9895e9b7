"""One tokenizer loader for the cache, evaluation, sampling and export: ``trainer.init: hf:FOLDER`` with
``data.tokenizer: FOLDER`` runs through all of them (the evaluator used to open the folder as a file)."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from tokenizers import Tokenizer
from trainer_fixtures import save_tiny_hf_llama, write_config

from halyard.train.cli import main
from halyard.train.corpora.python_stdlib import write_python_stdlib_corpus
from halyard.train.corpora.tokenizer import END_OF_TEXT, train_bpe_tokenizer
from halyard.train.data_assembly.tokenizer import tokenizer_path_of
from halyard.train.run_config import DataConfig


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama and its fast tokenizer, as save_pretrained writes them."""
    folder = tmp_path_factory.mktemp("hf-with-tokenizer")
    shards = write_python_stdlib_corpus(folder / "corpus", 30)
    bpe = train_bpe_tokenizer(shards, folder / "corpus" / "bpe.json", 512)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(bpe)), eos_token=END_OF_TEXT
    )
    fast.save_pretrained(folder)
    return save_tiny_hf_llama(folder)


def test_hf_init_with_the_tokenizer_folder_through_eval_sampling_and_export(
    tmp_path: Path, hf_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        run,
        tmp_path / "cache",
        data={"tokenizer": str(hf_folder), "validation_fraction": 0.1},
        trainer={
            "steps": 2,
            "init": f"hf:{hf_folder}",
            "eval_batches": 1,
            "sample_prompt": "def ",
            "sample_tokens": 4,
        },
    )
    assert main(["train", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "step 2: eval_loss=" in out and "--- sample after step 2 ---\ndef " in out

    assert main(["eval", "--run", str(run)]) == 0
    assert '"eval_bits_per_byte"' in capsys.readouterr().out
    assert main(["generate", "--run", str(run), "--prompt", "import ", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("import ")
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "exported")]) == 0
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    original = transformers.AutoTokenizer.from_pretrained(hf_folder)
    text = "def main():\n    return 0\n"
    assert exported(text)["input_ids"] == original(text)["input_ids"]
    assert exported.eos_token == END_OF_TEXT


def test_the_hf_folder_is_the_default_tokenizer(tmp_path: Path, hf_folder: Path) -> None:
    builtin = DataConfig(builtin_corpus="python-stdlib")
    assert tokenizer_path_of(builtin, tmp_path, init=f"hf:{hf_folder}") == str(hf_folder)
    # Without one in the folder, the builtin corpus trains its own.
    trained = tokenizer_path_of(builtin, tmp_path, init=f"hf:{tmp_path}")
    assert trained == str(tmp_path / "cache" / "corpus" / "tokenizer.json")
