"""The Ray builder (tasks over shards on a local Ray) writes the same bytes as the local builder."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import folder_bytes, make_documents, write_jsonl_shards

from halyard.data import MissingFieldError, build_cache


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
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
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
