"""Training while the token cache is built: the first step runs before the build ends, a step that catches
up with the build waits (and goodput says so), and a run started on a partial cache, killed and resumed on
the finished cache has the bits of a run started on the finished cache.

The second shard is read through `gated_files` (``gated://``), so the test decides when the build can finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gated_files import open_gate
from tokenizers import Tokenizer
from trainer_fixtures import assert_bitwise_equal, load_config, write_config

from halyard.data import TokenCache, build_cache
from halyard.train.corpora.python_stdlib import write_python_stdlib_corpus
from halyard.train.corpora.tokenizer import train_bpe_tokenizer
from halyard.train.trainer.trainer import Trainer

SEQ_LEN, BATCH, ERA = 32, 8, 16  # an era is two steps of sequences


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """Shard a (one era and a bit: steps 1-2) and shard b (the rest), and a tokenizer trained on them."""
    folder = tmp_path_factory.mktemp("while_tokenizing")
    stdlib = write_python_stdlib_corpus(folder / "stdlib", 12)
    tokenizer_path = str(train_bpe_tokenizer(stdlib, folder / "tokenizer.json", 512))
    tokenizer = Tokenizer.from_file(tokenizer_path)
    documents = [json.loads(line)["text"] for shard in stdlib for line in shard.read_text().splitlines()]
    pieces = [document[start : start + 400] for document in documents for start in range(0, 4000, 400)]
    first, tokens = [], 0
    while tokens < ERA * SEQ_LEN + 2 * SEQ_LEN:  # era 0 fits, era 1 does not
        first.append(pieces.pop(0))
        tokens += len(tokenizer.encode(first[-1]).ids) + 1
    assert tokens < 2 * ERA * SEQ_LEN
    for name, texts in (("a.jsonl", first), ("b.jsonl", pieces)):
        (folder / name).write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return folder / "a.jsonl", folder / "b.jsonl", tokenizer_path


def _config(
    tmp_path: Path,
    name: str,
    corpus: tuple[Path, Path, str],
    cache_dir: Path,
    every_steps: int | None = 1,
    progress: bool = False,
) -> Path:
    shard_a, shard_b, tokenizer_path = corpus
    data = {
        "builtin_corpus": None,
        "sources": [f"gated://{shard_a}", f"gated://{shard_b}"],
        "tokenizer": tokenizer_path,
        "shuffle": "era",
        "era_windows": ERA,
        "seq_len": SEQ_LEN,
    }
    return write_config(
        tmp_path / f"{name}.yaml",
        tmp_path / name,
        cache_dir,
        data=data,
        trainer={"steps": 6, "batch_size": BATCH, "progress": progress},
        checkpoint={"every_steps": every_steps},
    )


def _records(run_dir: Path) -> dict[int, dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines if line.strip()]
    return {int(r["step"]): r for r in records if "loss" in r}


def _gates(corpus: tuple[Path, Path, str]) -> tuple[Path, Path]:
    for shard in corpus[:2]:
        Path(f"{shard}.open").unlink(missing_ok=True)
    open_gate(corpus[0])
    return corpus[0], corpus[1]


def test_first_step_runs_before_the_build_ends_and_waiting_counts_in_goodput(
    tmp_path: Path, corpus: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, shard_b = _gates(corpus)
    path = _config(tmp_path, "early", corpus, tmp_path / "cache", every_steps=None, progress=True)

    def open_b_after_step_1() -> None:
        deadline = time.monotonic() + 120  # a trainer waiting for the whole build fails below, not hangs
        while 1 not in _records(tmp_path / "early") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)  # steps 3-6 need shard b: the run waits for it
        open_gate(shard_b)

    threading.Thread(target=open_b_after_step_1, daemon=True).start()
    result = Trainer(load_config(path)).fit()
    records = _records(tmp_path / "early")
    # The cache as it was when step 1 ran: shard a only, the build unfinished.
    assert records[1]["data/build_finished"] == 0 and records[1]["data/build_shards_finished"] == 1
    assert records[6]["data/build_finished"] == 1
    assert TokenCache.open(str(tmp_path / "cache" / "tokens")).is_finished
    assert result.summary["goodput/data_wait_seconds"] >= 1.0
    shown = capsys.readouterr()
    assert "halyard.data: waiting for" in shown.err and "tokens/s)" in shown.err
    # Two loader threads wait; together they print at most once per 10 s (the reader's
    # wait_message_seconds) of the run, whichever waits: before step 1 (under load) and for shard b.
    elapsed = result.summary["goodput/total_seconds"]
    assert 1 <= shown.err.count("halyard.data: waiting for") <= 1 + elapsed // 10
    assert "built=" in shown.err  # the progress bar shows the build while it runs
    assert "waiting for data" in shown.out and "data: the token cache is built" in shown.out


def test_partial_cache_start_kill9_resume_on_finished_cache_equals_a_run_on_the_finished_cache(
    tmp_path: Path, corpus: tuple[Path, Path, str]
) -> None:
    _, shard_b = _gates(corpus)
    cache_dir = tmp_path / "cache"
    killed = _config(tmp_path, "killed", corpus, cache_dir)
    here = Path(__file__).parent
    code = (
        "import sys; import gated_files; from halyard.train.cli import train_main; "
        "sys.exit(train_main(sys.argv[1:]))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
        JAX_PLATFORMS="cpu",
    )
    with open(tmp_path / "stderr.txt", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", code, "--config", str(killed)], stderr=stderr, env=env
        )
        deadline = time.monotonic() + 300
        # Steps 1-2 read shard a; step 3 waits for shard b, which stays closed: kill -9 while it waits.
        while (
            2 not in _records(tmp_path / "killed")
            or "waiting for" not in (tmp_path / "stderr.txt").read_text()
        ):
            assert process.poll() is None and time.monotonic() < deadline, (
                tmp_path / "stderr.txt"
            ).read_text()
            time.sleep(0.1)
        # Let the step-2 checkpoint's background write commit (a fixed sleep was too short under load).
        marker = tmp_path / "killed" / "checkpoints" / "step_00000002" / "halyard_checkpoint.json"
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, (
                tmp_path / "stderr.txt"
            ).read_text()
            time.sleep(0.1)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert not TokenCache.open(str(cache_dir / "tokens")).is_finished
    assert max(_records(tmp_path / "killed")) == 2

    open_gate(shard_b)  # the build completes, then the run resumes on the finished cache
    build_cache(
        [f"gated://{corpus[0]}", f"gated://{corpus[1]}"], corpus[2], str(cache_dir / "tokens"), num_workers=0
    )
    resumed = Trainer(load_config(killed)).fit()
    assert resumed.history[0]["step"] == 3  # it resumed from the step-2 checkpoint
    reference = Trainer(load_config(_config(tmp_path, "reference", corpus, cache_dir))).fit()
    assert_bitwise_equal(reference.state.params, resumed.state.params)
    losses = {step: record["loss"] for step, record in _records(tmp_path / "killed").items()}
    assert losses == {int(record["step"]): record["loss"] for record in reference.history}
