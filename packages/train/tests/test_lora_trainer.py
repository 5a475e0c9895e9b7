"""LoRA fine-tuning in the trainer: only the adapters train (optimizer state, gradients and checkpoints
hold nothing else), a preempted run on a Hugging Face base resumes to the same bits, `halyard train` +
`halyard export --lora adapter|merge` give what PEFT computes, `halyard plan` counts the frozen base."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
import pytest
from float_tolerance import referee_terms, summation_tolerance
from trainer_fixtures import StopAfter, assert_bitwise_equal, load_config, save_tiny_hf_llama, write_config

from halyard.models.lora import LoraAdapter, lora_params, without_lora
from halyard.train.checkpoint.commit_marker import read_commit_marker
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.cli import main
from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import save_resolved_config
from halyard.train.lora.adapters import trainable_params
from halyard.train.plan.accelerators import accelerator
from halyard.train.plan.command import format_plan
from halyard.train.plan.step_memory import step_memory
from halyard.train.run.loading import load_run_model
from halyard.train.trainer.trainer import Trainer

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"rank": 4, "alpha": 8.0, "target_modules": TARGETS}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-cache")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_hf_llama(tmp_path_factory.mktemp("hf-llama"))


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, object]:
    """(config file, fit result) of a 4-step LoRA run on the seed's initialisation."""
    folder = tmp_path_factory.mktemp("lora-run")
    path = write_config(folder / "run.yaml", folder / "run", cache_dir, trainer={"steps": 4}, lora=LORA)
    return path, Trainer(load_config(path)).fit()


def _size(tree: object) -> int:
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(tree) if leaf.dtype.kind == "f")


def test_only_the_adapters_have_state_gradients_and_checkpoints(scratch_run: tuple[Path, object]) -> None:
    path, result = scratch_run
    config = load_config(path)
    adapters = result.state.params  # type: ignore[attr-defined]
    assert sorted(adapters) == sorted(TARGETS) and all(isinstance(a, LoraAdapter) for a in adapters.values())
    assert _size(result.state.opt_state) == 2 * _size(adapters)  # type: ignore[attr-defined]  # AdamW's moments
    assert _size(adapters) < _size(config.model.init(jax.random.PRNGKey(0))) / 5
    fresh = trainable_params(config.lora, config.model.init, jax.random.PRNGKey(config.trainer.seed))
    for name, adapter in adapters.items():  # both A and B trained (B starts at zero)
        assert not np.asarray(fresh[name].lora_b.array).any() and np.asarray(adapter.lora_b.array).any()
        assert not np.array_equal(fresh[name].lora_a.array, adapter.lora_a.array)

    whole = Trainer(config).restore_state()  # the base from its reference, joined with the adapters
    initialised = jax.jit(config.model.init)(jax.random.PRNGKey(config.trainer.seed))
    assert_bitwise_equal(without_lora(whole.params), initialised)
    evaluated = load_run_model(config.trainer.run_dir).model  # what halyard eval --tasks scores
    assert_bitwise_equal(lora_params(evaluated), lora_params(whole.params))
    assert_bitwise_equal(without_lora(evaluated), initialised)
    step_dir = CheckpointManager(Path(config.trainer.run_dir) / "checkpoints").step_path(4)
    marker = read_commit_marker(step_dir)
    weights = [leaf.path for leaf in marker.leaves if leaf.path.startswith(".params")]
    assert weights and all(".lora_a" in p or ".lora_b" in p for p in weights), weights[:3]
    assert marker.extra_metadata["lora"] == {
        "base": "scratch", "seed": 0, "rank": 4, "alpha": 8.0, "target_modules": sorted(TARGETS),
    }  # fmt: skip


def test_a_checkpoint_of_a_run_without_lora_is_the_base_of_weights_init(
    tmp_path: Path, cache_dir: Path
) -> None:
    plain = Trainer(
        load_config(write_config(tmp_path / "p.yaml", tmp_path / "plain", cache_dir, trainer={"steps": 2}))
    ).fit()
    init = {"init": f"weights:{tmp_path / 'plain' / 'checkpoints'}", "steps": 2}
    path = write_config(tmp_path / "l.yaml", tmp_path / "lora", cache_dir, trainer=init, lora=LORA)
    Trainer(load_config(path)).fit()
    whole = Trainer(load_config(path)).restore_state()
    assert_bitwise_equal(without_lora(whole.params), plain.state.params)
    marker = read_commit_marker(CheckpointManager(tmp_path / "lora" / "checkpoints").step_path(2))
    assert marker.extra_metadata["lora"]["base"] == init["init"]


def test_a_preempted_run_on_a_hugging_face_base_resumes_to_the_same_bits(
    tmp_path: Path, cache_dir: Path, hf_folder: Path
) -> None:
    sections = dict(trainer={"init": f"hf:{hf_folder}"}, lora={**LORA, "dropout": 0.1})
    reference = Trainer(
        load_config(write_config(tmp_path / "whole.yaml", tmp_path / "whole", cache_dir, **sections))
    ).fit()
    split = load_config(write_config(tmp_path / "split.yaml", tmp_path / "split", cache_dir, **sections))
    with pytest.raises(SystemExit) as stopped:
        Trainer(split, preemption=StopAfter(3)).fit()
    assert stopped.value.code == 143
    resumed = Trainer(split).fit()  # adapters from the checkpoint, the base reloaded from hf:
    assert int(resumed.state.step) == 6
    assert_bitwise_equal(reference.state.params, resumed.state.params)
    assert_bitwise_equal(reference.state.opt_state, resumed.state.opt_state)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in reference.history][3:]
    changed = load_config(tmp_path / "split.yaml", "--lora.rank", "8", "--trainer.steps", "8")
    with pytest.raises(ConfigError, match=r"lora.rank=8, but this run's checkpoints hold adapters with 4"):
        Trainer(changed).fit()


def test_training_from_hugging_face_through_the_cli_exports_what_peft_computes(
    tmp_path: Path, cache_dir: Path, hf_folder: Path
) -> None:
    import peft
    import torch
    import transformers

    path = write_config(
        tmp_path / "run.yaml",
        tmp_path / "run",
        cache_dir,
        trainer={"steps": 3, "init": f"hf:{hf_folder}"},
        lora=LORA,
    )
    assert main(["train", "--config", str(path)]) == 0
    run = str(tmp_path / "run")
    assert main(["export", "--run", run, "--out", str(tmp_path / "adapter"), "--lora", "adapter"]) == 0
    assert main(["export", "--run", run, "--out", str(tmp_path / "merged")]) == 0
    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(hf_folder.resolve())

    tokens = np.random.default_rng(0).integers(0, 512, (2, 16))
    load = transformers.AutoModelForCausalLM.from_pretrained
    with torch.no_grad():
        with_peft = peft.PeftModel.from_pretrained(load(hf_folder), tmp_path / "adapter").eval()
        expected = with_peft(torch.tensor(tokens)).logits.numpy()
        merged = load(tmp_path / "merged").eval()(torch.tensor(tokens)).logits.numpy()
        base = load(hf_folder).eval()(torch.tensor(tokens)).logits.numpy()
    from halyard.named import named

    model = jax.device_get(Trainer(load_config(path)).restore_state().params)
    logits = np.asarray(
        model(named(tokens.astype(np.int32), ("batch", "pos"))).unwrap("batch", "pos", "vocab")
    )
    # Halyard's adapters against peft's, and transformers' merged weights against peft's unmerged ones: two
    # orders of each forward pass, rotary angles and the adapters' rank-4 sums in every adapted projection
    config = model.model_config
    terms = referee_terms(config, tokens.shape[1]) + LORA["rank"] * len(TARGETS) * config.shape.layers
    bound = summation_tolerance(expected, terms)
    np.testing.assert_allclose(logits, expected, atol=bound, rtol=0)
    np.testing.assert_allclose(merged, expected, atol=bound, rtol=0)
    assert np.abs(base - expected).max() > 1e-3, "three steps moved the model away from its base"


def test_plan_counts_the_frozen_base_apart_from_the_small_optimizer_state(
    tmp_path: Path, cache_dir: Path
) -> None:
    config = load_config(write_config(tmp_path / "lora.yaml", tmp_path / "lora", cache_dir, lora=LORA))
    plan = step_memory(config, jax.devices()[:1])
    assert plan.trained_params is not None and plan.trained_params * 5 < plan.num_params
    assert plan.frozen_params == 4 * plan.num_params and plan.params == 4 * plan.trained_params  # float32
    assert plan.optimizer_state == pytest.approx(2 * plan.params, abs=64)  # AdamW's moments of the adapters
    assert plan.gradients == plan.params
    # XLA's arguments: the base once, the adapters, their optimizer state and the batch
    assert plan.arguments == pytest.approx(
        plan.frozen_params + plan.params + plan.optimizer_state + plan.batch, abs=64
    )
    report = format_plan(config, plan, accelerator("tpu-v5e", "float32"), mfu=0.4)
    assert "frozen base" in report and "trained (LoRA adapters)" in report


def test_mistakes_are_one_line_naming_the_key(
    tmp_path: Path, cache_dir: Path, scratch_run: tuple[Path, object], capsys: pytest.CaptureFixture[str]
) -> None:
    gpt2 = {
        "type": "gpt2",
        "vocab_size": 512,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 4,
        "max_position": 64,
    }
    path = write_config(
        tmp_path / "g.yaml",
        tmp_path / "g",
        cache_dir,
        model=gpt2,
        lora={"rank": 2, "target_modules": ["gate_proj"]},
    )
    with pytest.raises(
        ConfigError,
        match=r"^lora.target_modules: 'gate_proj' is not a linear layer of a gpt2 model; valid: q_proj",
    ):
        Trainer(load_config(path))
    with pytest.raises(
        ConfigError,
        match=r"lora.rank=0, but this run's checkpoints .* written with LoRA adapters of rank 4: set lora.rank: 4",
    ):
        Trainer(load_config(scratch_run[0], "--lora.rank", "0"))
    lora_checkpoint = Path(load_config(scratch_run[0]).trainer.run_dir) / "checkpoints"
    path = write_config(
        tmp_path / "w.yaml", tmp_path / "w", cache_dir, trainer={"init": f"weights:{lora_checkpoint}"}
    )
    with pytest.raises(ConfigError, match="holds LoRA adapters, not a whole model: export that run merged"):
        Trainer(load_config(path))
    plain_run = tmp_path / "plain-run"
    save_resolved_config(load_config(write_config(tmp_path / "p.yaml", plain_run, cache_dir)), plain_run)
    with pytest.raises(SystemExit) as raised:
        main(["export", "--run", str(plain_run), "--out", str(tmp_path / "x"), "--lora", "adapter"])
    assert raised.value.code == 2 and "trained no adapters (lora.rank is 0)" in capsys.readouterr().err


def test_halyard_serve_lora_serves_a_runs_adapters_beside_its_base(scratch_run: tuple[Path, object]) -> None:
    from halyard.models.lora import merge_lora
    from halyard.serve import Engine, EngineConfig, SamplingParams
    from halyard.serve.server.loading import served_model
    from halyard.serve.server.lora import lora_specs, with_lora
    from halyard.train.run.loading import load_run_adapters

    run_dir = Path(load_config(scratch_run[0]).trainer.run_dir)
    loaded = load_run_model(run_dir)
    assert_bitwise_equal(load_run_adapters(run_dir), jax.device_get(lora_params(loaded.model)))
    base = served_model(jax.device_get(without_lora(loaded.model)), loaded.tokenizer, "base")
    # what `halyard serve --run BASE --lora tuned=RUN` serves
    served = with_lora(base, lora_specs([f"tuned={run_dir}"]), load_run_adapters)
    assert served.adapters == ("tuned",)
    config = EngineConfig(page_size=8, num_pages=32, max_context=64, max_running=4)
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=True, ignore_eos=True)
    prompt = [3, 1, 4, 1, 5, 9]
    tuned, plain = Engine(served.model, config).generate([prompt] * 2, [replace(params, adapter=1), params])
    (merged,) = Engine(jax.device_get(merge_lora(loaded.model)), config).generate([prompt], params)
    assert tuned.samples[0].token_ids == merged.samples[0].token_ids
    np.testing.assert_allclose(tuned.samples[0].logprobs, merged.samples[0].logprobs, atol=1e-4, rtol=0)
    assert not np.array_equal(tuned.samples[0].logprobs, plain.samples[0].logprobs)
