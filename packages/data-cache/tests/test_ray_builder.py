"""The Ray builder (tasks over shards on a local Ray) writes the same bytes as the local builder; a local Ray
gets the time a loaded machine needs to start, and one that does not start is one line."""

from __future__ import annotations

import re
import sys
import time
import types
from pathlib import Path

import pytest
from data_helpers import folder_bytes, make_documents, write_jsonl_shards

from halyard.data import MissingFieldError, build_cache
from halyard.data.builders.ray_builder import start_local_ray
from halyard.data.cli import main


@pytest.mark.ray
def test_ray_builder_equals_local_builder(tmp_path: Path, tokenizer_path: str):
    try:
        import ray
    except ImportError:
        pytest.fail(
            "Ray is not installed: pip install 'halyard-data-cache[ray]' (the Ray test must run in CI)"
        )
    write_jsonl_shards(tmp_path / "src", make_documents(300, seed=40), num_shards=3)
    build_cache(
        str(tmp_path / "src"),
        tokenizer_path,
        str(tmp_path / "local"),
        num_workers=0,
        chunk_tokens=300,
        progress=False,
    )
    try:
        start_local_ray(2, configure_logging=False)  # the builder's own start: patient on a loaded machine
    except Exception as error:
        pytest.fail(
            f"a local Ray could not start on this machine ({error!r}); the Ray builder is untested here"
        )
    try:
        cache = build_cache(
            str(tmp_path / "src"),
            tokenizer_path,
            str(tmp_path / "ray"),
            builder="ray",
            num_workers=2,
            chunk_tokens=300,
            progress=False,
        )
        # A shard task's bad input arrives as its own error, without Ray's wrapper and its traceback text.
        (tmp_path / "body.jsonl").write_text('{"body": "no text field"}\n')
        with pytest.raises(MissingFieldError) as raised:
            build_cache(
                str(tmp_path / "body.jsonl"),
                tokenizer_path,
                str(tmp_path / "bad"),
                builder="ray",
                progress=False,
            )
        assert type(raised.value) is MissingFieldError and "\n" not in str(raised.value)
        assert "body.jsonl:1: text field 'text' not found" in str(raised.value)
    finally:
        ray.shutdown()
    assert cache.is_finished and cache.num_documents == 300
    assert folder_bytes(tmp_path / "ray") == folder_bytes(tmp_path / "local")


class SlowRay(types.ModuleType):
    """A stand-in for ``ray`` whose local node registers ``registers_after`` seconds after ``init`` starts
    (never when None), and whose ``init`` gives up after ``own_wait`` seconds, as Ray's gives up after 30."""

    def __init__(self, registers_after: float | None, own_wait: float) -> None:
        super().__init__("ray")
        self.registers_after, self.own_wait = registers_after, own_wait
        self.started: float | None = None
        self._private = types.SimpleNamespace(services=types.SimpleNamespace(get_node=self._get_node))

    def _get_node(self, gcs_address: str, node_id: str) -> dict:
        assert self.started is not None
        waited = time.monotonic() - self.started
        if self.registers_after is None or waited < self.registers_after:
            raise RuntimeError(f"node {node_id} not found")
        return {"node_id": node_id}

    def is_initialized(self) -> bool:
        return False

    def init(self, **options: object) -> None:  # what ray/_private/node.py does while a local Ray starts
        self.started = time.monotonic()
        while True:
            try:
                self._private.services.get_node("127.0.0.1:6379", "node")
                return
            except RuntimeError:
                pass
            if time.monotonic() - self.started > self.own_wait:
                raise Exception(
                    "The current node timed out during startup. This could happen because some of the raylet "
                    "failed to startup or the GCS has become overloaded."
                )
            time.sleep(0.01)


def test_a_local_ray_gets_the_time_a_loaded_machine_needs_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = SlowRay(registers_after=0.6, own_wait=0.2)
    monkeypatch.setitem(sys.modules, "ray", slow)
    start_local_ray(2)
    assert time.monotonic() - (slow.started or 0) >= 0.6
    assert slow._private.services.get_node == slow._get_node  # Ray is left as it was


def test_a_local_ray_that_does_not_start_is_one_line(
    tmp_path: Path, tokenizer_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", SlowRay(registers_after=None, own_wait=0.2))
    monkeypatch.setattr("halyard.data.builders.ray_builder.LOCAL_RAY_START_SECONDS", 0.5)
    write_jsonl_shards(tmp_path / "src", make_documents(10, seed=41), num_shards=1)
    argv = [
        "build",
        "--source",
        str(tmp_path / "src"),
        "--tokenizer",
        tokenizer_path,
        "--out",
        str(tmp_path / "c"),
    ]
    assert main([*argv, "--ray", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.match(r"error: a local Ray did not start \(after \d+ s: The current node timed out during", err)
    assert "\n" not in err and "builder" in err and "ray start --head" in err
