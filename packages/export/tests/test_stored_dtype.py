"""`HfModelInfo.stored_dtype`: the dtype a config.json says its weights are stored in, read from a published
checkpoint's config (``torch_dtype``, transformers before 4.56) and from what `export_hf` writes (``dtype``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax

from halyard.export import export_hf, read_hf_config
from halyard.models import init_model, model_config

CONFIGS = Path(__file__).parent / "fixtures" / "hf-configs"


def test_a_published_config_and_an_exported_folder_name_their_dtype(tmp_path: Path) -> None:
    published = tmp_path / "published"
    published.mkdir()
    shutil.copy(CONFIGS / "qwen2" / "Qwen2.5-0.5B.json", published / "config.json")
    assert json.loads((published / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert read_hf_config(published)[1].stored_dtype == "bfloat16"

    tiny = model_config(
        "llama",
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
    )
    model = init_model(tiny, jax.random.key(0))
    for dtype in ("bfloat16", "float32"):
        export_hf(model, tmp_path / dtype, dtype=dtype)
        assert read_hf_config(tmp_path / dtype)[1].stored_dtype == dtype

    config = json.loads((published / "config.json").read_text())
    for key, value in (("torch_dtype", "torch.float16"), ("torch_dtype", None)):
        config[key] = value
        (published / "config.json").write_text(json.dumps(config))
        assert read_hf_config(published)[1].stored_dtype == (value and "float16")
