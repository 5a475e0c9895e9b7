"""A planted loss spike: a document of random garbage among source code. ``train`` logs the spike at the steps
whose batches hold it, naming that document and its offsets; ``halyard replay`` of the step recomputes it
from the checkpoint before, prints the planted document first and the logged loss with the same bits."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from trainer_fixtures import fails, load_config, write_config

from halyard.data import TokenCache
from halyard.train import train_bpe_tokenizer
from halyard.train.cli import main
from halyard.train.corpora.python_stdlib import stdlib_source_files
from halyard.train.trainer.trainer import Trainer
from halyard.train.watch.spikes import read_spikes

PLANTED = 40
"""The garbage document's index in the corpus (and in the cache: one shard, no skipped record)."""
BATCH, SEQ_LEN = 8, 32


def source_code(count: int = 120, size: int = 400) -> list[str]:
    """``count`` pieces of ``size`` characters of standard-library code, in a fixed shuffled order."""
    pieces = []
    for path in stdlib_source_files(12):
        text = path.read_text(errors="replace")
        pieces += [text[i : i + size] for i in range(0, len(text), size)]
    order = np.random.default_rng(0).permutation(count)
    return [pieces[i] for i in order]


def garbage(characters: int = 500) -> str:
    """Random characters the code-trained tokenizer has no merges for (several hundred tokens)."""
    alphabet = list("qzxjkvw#@!$%^&*~`|<>{}[]0123456789ЖЯßøçđ")
    return "".join(np.random.default_rng(7).choice(alphabet, size=characters))


@pytest.fixture(scope="module")
def spiked_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("spike")
    code = source_code()
    (folder / "code.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in code))
    documents = [*code[:PLANTED], garbage(), *code[PLANTED:]]
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    tokenizer = train_bpe_tokenizer([folder / "code.jsonl"], folder / "tokenizer.json", vocab_size=512)
    path = write_config(
        folder / "spike.yaml",
        folder / "run",
        folder / "cache",
        data={
            "builtin_corpus": None,
            "max_documents": None,
            "sources": [str(folder / "corpus.jsonl")],
            "tokenizer": str(tokenizer),
            "shuffle": "none",  # example i is window i: the garbage lands where the corpus puts it
            "seq_len": SEQ_LEN,
        },
        trainer={
            "steps": 34,
            "batch_size": BATCH,
            "log_every": 10,
            "spikes": {"zscore": 4, "window": 20, "min_steps": 8},
        },
        checkpoint={"every_steps": 5, "keep_last": 10},
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # `Trainer.fit`, what `train` runs, in this process
        Trainer(load_config(path)).fit()
    assert "loss spike at step" in printed.getvalue()
    return folder / "run"


def planted_steps(run: Path) -> set[int]:
    """The steps (1-based) whose batches hold a token of the planted document."""
    start, stop = TokenCache.open(str(run.parent / "cache" / "tokens")).document_span(PLANTED)
    tokens_per_step = BATCH * SEQ_LEN  # window w starts at token w * seq_len; step s holds windows 8(s-1)...
    return set(range(start // tokens_per_step + 1, (stop - 1) // tokens_per_step + 2))


def test_the_spike_is_logged_at_the_planted_documents_steps_naming_it(spiked_run: Path) -> None:
    spikes = read_spikes(spiked_run)
    assert spikes and {spike["step"] for spike in spikes} <= planted_steps(spiked_run)
    cache = TokenCache.open(str(spiked_run.parent / "cache" / "tokens"))
    for spike in spikes:
        assert spike["examples"] == [(spike["step"] - 1) * BATCH, spike["step"] * BATCH]
        for worst in spike["worst"]:
            position = worst["token"]  # the row's first token in the stream, then each document's part
            found = False
            for document in worst["documents"]:
                assert cache.document_at(position) == (document["document"], document["offset"])
                if document["document"] == PLANTED:
                    found = True
                    assert document["source"].endswith("corpus.jsonl") and document["number"] == PLANTED
                position += document["tokens"]
            assert found, worst  # every named example holds garbage
    lines = {
        json.loads(line)["step"]: json.loads(line)
        for line in (spiked_run / "metrics.jsonl").read_text().splitlines()
    }
    for spike in spikes:  # the trackers have the spike at its step (metrics.jsonl although log_every is 10)
        assert lines[spike["step"]]["spike/zscore"] == spike["zscore"]  # one Python float, in both files
        assert lines[spike["step"]]["loss"] == spike["loss"]


def test_replay_prints_the_planted_document_first_and_the_logged_loss_bit_for_bit(
    spiked_run: Path, capsys
) -> None:
    spike = max(read_spikes(spiked_run), key=lambda record: record["zscore"])
    capsys.readouterr()
    assert main(["replay", "--run", str(spiked_run), "--step", str(spike["step"])]) == 0
    out = capsys.readouterr().out
    loss_line = next(line for line in out.splitlines() if line.startswith("loss "))
    assert loss_line.endswith("the same bits"), loss_line
    assert float(loss_line.split()[1]) == spike["loss"]  # the float32 loss as logged, every bit
    documents = re.findall(r"^    document (\d+) from token", out, flags=re.MULTILINE)
    assert documents[0] == str(PLANTED)
    assert "activation/rms/layers" in out and "attention/logit_max/layers" in out


def test_replay_refuses_a_step_without_a_checkpoint_before_it(spiked_run: Path, capsys) -> None:
    code, message = fails(capsys, ["replay", "--run", str(spiked_run), "--step", "3"])
    assert code == 2 and "no checkpoint at or before step 2" in message and "checkpoint.keep" in message
