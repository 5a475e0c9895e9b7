"""`trainer.init=hf:PATH` starts from a Hugging Face folder; `halyard export` writes one back."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
import torch  # the CPU build `make test` installs: transformers is the reference
import transformers
from float_tolerance import referee_terms, summation_tolerance
from trainer_fixtures import assert_bitwise_equal, load_config, save_tiny_hf_llama, write_config

from halyard.export import import_hf
from halyard.train.cli import main
from halyard.train.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_hf_llama(tmp_path_factory.mktemp("hf-llama"))


def test_init_from_hf_then_export_loads_in_transformers(tmp_path: Path, hf_folder: Path) -> None:
    cache = tmp_path / "cache"
    start = write_config(
        tmp_path / "start.yaml",
        tmp_path / "start",
        cache,
        trainer={"steps": 0, "init": f"hf:{hf_folder}"},
        optimizer={"schedule": {"type": "constant", "warmup": 0}},
    )
    started = Trainer(load_config(start)).fit()
    _, imported = import_hf(hf_folder)
    assert_bitwise_equal(imported, started.state.params)

    run = write_config(
        tmp_path / "run.yaml", tmp_path / "run", cache, trainer={"steps": 2, "init": f"hf:{hf_folder}"}
    )
    trained = Trainer(load_config(run)).fit()
    assert int(trained.state.step) == 2
    out = tmp_path / "exported"
    assert main(["export", "--run", str(tmp_path / "run"), "--out", str(out)]) == 0

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = np.random.default_rng(0).integers(0, 512, (2, 16))
    with torch.no_grad():
        expected = reloaded(torch.tensor(tokens)).logits.numpy()
    from halyard.named import named

    model = jax.device_get(trained.state.params)
    logits = model(named(tokens.astype(np.int32), ("batch", "pos"))).unwrap("batch", "pos", "vocab")
    # two implementations of the same weights: each its own forward pass and rotary angles, at the logits' size
    bound = summation_tolerance(expected, referee_terms(model.model_config, tokens.shape[1]))
    np.testing.assert_allclose(np.asarray(logits), expected, atol=bound, rtol=0)
