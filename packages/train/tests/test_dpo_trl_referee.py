"""Halyard's DPO loss and gradients against TRL's `DPOTrainer` on the same weights, batch and beta.

The same tiny Llama weights are a Halyard model and, through `halyard.export`, a transformers model. TRL
computes the loss with its own `DPOTrainer.compute_loss` on the padded pair batch (chosen rows, then
rejected rows, with their completion masks) and torch autograd gives the gradients; Halyard's gradients,
exported with the same tensor mapping as the weights, must equal them for every tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, referee_terms, summation_tolerance
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from tokenizers import models as tokenizer_models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from halyard.export import export_hf  # noqa: E402
from halyard.models import init_model, model_config  # noqa: E402
from halyard.train.objectives.dpo import dpo_loss_fn, reference_logprobs  # noqa: E402

VOCAB = 48
EOS = 1
WIDTH = 12  # seq_len + 1
BETA = 0.3
CONFIG = model_config(
    "llama",
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position=32,
)
# A reply's summed log-probability in JAX and in torch: each computes the forward pass (and its rotary
# angles) itself, then the vocabulary's log-softmax and the sum over the row's positions.
LOGP_TERMS = referee_terms(CONFIG, WIDTH) + VOCAB + WIDTH


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The policy and reference weights as Halyard models and as exported transformers folders."""
    folder = tmp_path_factory.mktemp("dpo-referee")
    out: dict[str, Any] = {"folder": folder}
    for name, seed in (("policy", 1), ("reference", 0)):
        out[name] = init_model(CONFIG, jax.random.PRNGKey(seed))
        export_hf(out[name], folder / name, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=0)
    return out


def pair_batch(pairs: int, seed: int) -> dict[str, np.ndarray]:
    """Padded pairs: a shared prompt of 2-4 tokens after BOS, replies of 2-6 tokens ending in EOS."""
    rng = np.random.default_rng(seed)
    batch = {key: np.full((pairs, WIDTH), EOS if "tokens" in key else 0, np.int32) for key in _KEYS}
    for row in range(pairs):
        prompt = [0, *rng.integers(2, VOCAB, int(rng.integers(2, 5)))]
        for side in ("chosen", "rejected"):
            reply = [*rng.integers(2, VOCAB, int(rng.integers(2, 7))), EOS]
            batch[f"{side}_tokens"][row, : len(prompt) + len(reply)] = prompt + reply
            batch[f"{side}_loss_mask"][row, len(prompt) : len(prompt) + len(reply)] = 1
    return batch


_KEYS = ("chosen_tokens", "chosen_loss_mask", "rejected_tokens", "rejected_loss_mask")


def halyard_loss_and_grads(models: dict[str, Any], batch: dict[str, np.ndarray], **dpo: float):
    """The train step's view: the mean DPO loss over pairs and its gradient (sums / pairs)."""
    batch_jax = {key: jnp.asarray(value) for key, value in batch.items()}
    batch_jax.update(reference_logprobs(models["reference"], batch_jax))
    loss_fn = dpo_loss_fn(**dpo)
    (loss_sum, stats), grads = jax.value_and_grad(
        lambda model: loss_fn(model, batch_jax, jax.random.PRNGKey(0)), has_aux=True
    )(models["policy"])
    pairs = float(stats["num_tokens"])
    grads = jax.tree.map(lambda g: g / pairs, grads)
    return float(loss_sum) / pairs, {k: float(v) / pairs for k, v in stats.items()}, grads


@pytest.fixture(scope="module")
def trl_trainer(models: dict[str, Any]) -> Any:
    """A `trl.DPOTrainer` over the exported policy and reference (float32, CPU), beta `BETA`."""
    folder = models["folder"]
    policy = transformers.AutoModelForCausalLM.from_pretrained(folder / "policy", dtype=torch.float32)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder / "reference", dtype=torch.float32)
    vocabulary = {"<s>": 0, "</s>": EOS, **{f"w{i}": i for i in range(2, VOCAB)}}
    backend = Tokenizer(tokenizer_models.WordLevel(vocabulary, unk_token="</s>"))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    arguments = trl.DPOConfig(
        output_dir=str(folder / "trl"), beta=BETA, report_to="none", use_cpu=True, bf16=False, fp16=False
    )
    dataset = datasets.Dataset.from_list([{"prompt": "w2", "chosen": " w3", "rejected": " w4"}])
    trainer = trl.DPOTrainer(
        model=policy, ref_model=reference, args=arguments, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.model.train()
    return trainer


def trl_loss_and_grads(trainer: Any, batch: dict[str, np.ndarray]) -> tuple[float, dict[str, float], dict]:
    """TRL's loss of the batch (its collator's layout: chosen rows, then rejected rows) and torch's gradients."""
    input_ids = np.concatenate([batch["chosen_tokens"], batch["rejected_tokens"]])
    completion = np.concatenate([batch["chosen_loss_mask"], batch["rejected_loss_mask"]])
    lengths = np.maximum(completion * np.arange(1, WIDTH + 1), 0).max(axis=1)
    attention = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.int64)
    inputs = {
        "input_ids": torch.tensor(input_ids, dtype=torch.long),
        "attention_mask": torch.tensor(attention),
        "completion_mask": torch.tensor(completion, dtype=torch.long),
    }
    trainer.model.zero_grad()
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    grads = {
        name: p.grad.detach().numpy() for name, p in trainer.model.named_parameters() if p.grad is not None
    }
    return float(loss.detach()), metrics, grads


def exported_grads(grads: Any, folder: Path) -> dict[str, np.ndarray]:
    """Halyard's gradient tree written with the weights' tensor mapping: one array per HF tensor name."""
    export_hf(grads, folder, eos_token_id=EOS, overwrite=True)
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize(("loss_type", "pairs", "label_smoothing"), [("sigmoid", 3, 0.0), ("aot", 1, 0.2)])
def test_loss_and_gradients_equal_trl(
    models, trl_trainer, loss_type: str, pairs: int, label_smoothing: float
) -> None:
    batch = pair_batch(pairs, seed=pairs)
    # TRL's sigmoid loss has no label smoothing; its "aot" loss is the smoothed (conservative) DPO loss
    # once the sort over the batch is the identity, i.e. for a single pair. Its loss reads these three
    # attributes (set from DPOConfig at construction), so one trainer serves both losses.
    trl_trainer.loss_types, trl_trainer.loss_weights = [loss_type], [1.0]
    trl_trainer.label_smoothing = label_smoothing
    expected_loss, expected_metrics, expected_grads = trl_loss_and_grads(trl_trainer, batch)
    loss, metrics, grads = halyard_loss_and_grads(models, batch, beta=BETA, label_smoothing=label_smoothing)
    assert abs(loss - np.log(2)) > 1e-3  # the policy is not the reference: a real margin is compared
    bounds = metric_bounds(models, batch, pairs)
    # -log sigmoid's slope is below 1 in the margin; then its own function and the mean over the pairs
    loss_bound = bounds["rewards/margins"] + summation_tolerance(expected_loss, FUNCTION_TERMS + pairs + 2)
    np.testing.assert_allclose(loss, expected_loss, atol=loss_bound, rtol=0)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        bound = bounds[name]
        np.testing.assert_allclose(metrics[name], expected_metrics[name], atol=bound, rtol=0, err_msg=name)
    ours = exported_grads(grads, models["folder"] / f"grads-{loss_type}")
    assert set(ours) == set(expected_grads)
    # Each tensor's gradient at the largest one's size (assert_loss_and_grads_close's reason): the forward
    # and backward through the same sums, the sigmoid's factor, the sum over the pairs' rows.
    scale = max(float(np.abs(expected).max()) for expected in expected_grads.values())
    grad_bound = summation_tolerance(scale, 2 * LOGP_TERMS + FUNCTION_TERMS + 2 * pairs)
    for name, expected in expected_grads.items():
        assert np.abs(expected).max() > 0, name
        np.testing.assert_allclose(ours[name], expected, atol=grad_bound, rtol=0, err_msg=name)


def metric_bounds(models: dict[str, Any], batch: dict[str, np.ndarray], pairs: int) -> dict[str, float]:
    """How far the mean rewards of ``batch`` may differ between Halyard and TRL: ``beta`` times the policy's
    and the reference's summed log-probabilities' bounds (`LOGP_TERMS` at their sizes: log-probabilities are
    negative, so the mean of their sizes is the size of their mean), with the difference, the product and
    the mean; the margins add the chosen and the rejected; the accuracies, a share of the pairs, differ by
    its rounding in float32 (TRL's mean) against Python's division."""
    batch_jax = {key: jnp.asarray(value) for key, value in batch.items()}
    bounds = {}
    for side in ("chosen", "rejected"):
        sizes = [
            float(np.abs(np.mean(reference_logprobs(models[name], batch_jax)[f"reference_{side}_logps"])))
            for name in ("policy", "reference")
        ]
        bounds[f"rewards/{side}"] = BETA * summation_tolerance(sum(sizes), LOGP_TERMS + 3 + pairs)
    bounds["rewards/margins"] = bounds["rewards/chosen"] + bounds["rewards/rejected"]
    bounds["rewards/accuracies"] = summation_tolerance(1, 1)
    return bounds
