"""HalyardLM against lm-eval's own Hugging Face model (HFLM, CPU, float32) on the same exported tiny Llama:
the same per-example log-likelihoods (within `referee_terms` of each scored token) and accuracy on a local multiple-choice task, the same rolling
log-likelihoods and the same greedy continuations; and the same numbers on a mesh, through the registry
and from the HF folder."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import lm_eval
import numpy as np
import pytest
import torch
from float_tolerance import referee_terms, summation_tolerance
from harness_fixtures import TASK, tiny_llama_config, write_hf_llama, write_task, write_tokenizer
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from halyard.export import import_hf
from halyard.named import named
from halyard.shard import Layout, MeshSpec
from halyard.train.harness import HalyardLM, evaluate_tasks

MAX_LENGTH = 64
ROLLING_TEXTS = [
    "The cat sat on the mat.",
    " ".join(["Paris is the capital of France. Two plus two is four."] * 12),  # several windows
]
CONTEXTS = ["The dog ran to", "Water boils at one", "Rome"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("harness")
    tokenizer = write_tokenizer(root / "tokenizer")
    folder = write_hf_llama(root / "hf", tokenizer)
    tasks = write_task(root / "tasks", root / "datasets")
    hf = HFLM(pretrained=str(folder), device="cpu", dtype="float32", batch_size=4, max_length=MAX_LENGTH)
    reference = lm_eval.simple_evaluate(
        model=hf,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    config, model = import_hf(folder)
    return {
        "folder": folder, "tokenizer": tokenizer, "tasks": tasks, "hf": hf, "reference": reference,
        "config": config, "model": model,
    }  # fmt: skip


def _log_prob_size(setup: dict[str, Any], tokens: list[int]) -> float:
    """The largest ``|log p|`` of any token at any position of ``tokens`` (in windows of MAX_LENGTH): what
    the rounding of a log-prob scales with."""
    sizes = []
    for start in range(0, len(tokens), MAX_LENGTH):
        window = named(jnp.asarray([tokens[start : start + MAX_LENGTH]]), ("batch", "pos"))
        logits = setup["model"](window).unwrap("batch", "pos", "vocab")
        sizes.append(float(jnp.abs(jax.nn.log_softmax(logits, axis=-1)).max()))
    return max(sizes)


def _loglikelihood_tolerance(setup: dict[str, Any], text: str, scored: int) -> float:
    """How far lm-eval's transformers model and Halyard's may put the log-likelihood of ``scored`` tokens of
    ``text``: each token's log-prob by `referee_terms` (the forward pass in two implementations, the rotary
    angles at up to the window's length) and the vocabulary's sum, at the log-probs' size; then their sum."""
    tokens = HalyardLM(setup["model"], setup["tokenizer"], max_length=MAX_LENGTH).tok_encode(text)
    config = setup["config"]
    terms = referee_terms(config, min(len(tokens), MAX_LENGTH)) + config.shape.vocab + scored
    return scored * summation_tolerance(_log_prob_size(setup, tokens), terms)


def _per_example(results: dict[str, Any]) -> list[tuple[int, list[float], list[bool], float]]:
    """(doc id, log-likelihood of each choice, greedy flags, acc) of every example, by doc id."""
    rows = []
    for sample in sorted(results["samples"][TASK], key=lambda s: s["doc_id"]):
        raw = [float(resp[0][0]) for resp in sample["resps"]]
        filtered = [float(resp[0]) for resp in sample["filtered_resps"]]
        assert raw == filtered
        rows.append((sample["doc_id"], raw, [bool(r[0][1]) for r in sample["resps"]], sample["acc"]))
    return rows


def _tolerances(setup: dict[str, Any]) -> list[list[float]]:
    """`_loglikelihood_tolerance` of every choice of every example (by doc id) of the reference run."""
    if "tolerances" not in setup:
        lm = HalyardLM(setup["model"], setup["tokenizer"], max_length=MAX_LENGTH)
        samples = sorted(setup["reference"]["samples"][TASK], key=lambda s: s["doc_id"])
        setup["tolerances"] = [
            [
                _loglikelihood_tolerance(setup, context + continuation, len(lm.tok_encode(continuation)) + 1)
                for context, continuation in sample["arguments"]
            ]
            for sample in samples
        ]
    return setup["tolerances"]


def _assert_same_examples(ours: dict[str, Any], theirs: dict[str, Any], setup: dict[str, Any]) -> None:
    mine, reference = _per_example(ours), _per_example(theirs)
    assert [row[0] for row in mine] == [row[0] for row in reference] == list(range(6))
    tolerances = _tolerances(setup)
    for (doc, ll, greedy, acc), (_, ref_ll, ref_greedy, ref_acc) in zip(mine, reference, strict=True):
        difference = np.abs(np.asarray(ll) - np.asarray(ref_ll))
        assert np.all(difference <= tolerances[doc]), f"doc {doc}: {difference} > {tolerances[doc]}"
        assert greedy == ref_greedy and acc == ref_acc, f"doc {doc}"
    assert ours["results"][TASK]["acc,none"] == theirs["results"][TASK]["acc,none"]


def _halyard_lm(setup: dict[str, Any], **options: Any) -> HalyardLM:
    _, model = import_hf(setup["folder"])
    return HalyardLM(model, setup["tokenizer"], batch_size=4, max_length=MAX_LENGTH, **options)


def test_multiple_choice_log_likelihoods_and_accuracy_match_hflm(setup: dict[str, Any]) -> None:
    ours = evaluate_tasks(
        _halyard_lm(setup), [TASK], include_path=setup["tasks"], log_samples=True, bootstrap_iters=0
    )
    _assert_same_examples(ours, setup["reference"], setup)
    spread = [max(ll) - min(ll) for _, ll, _, _ in _per_example(ours)]
    assert min(spread) > 1e-2  # the choices differ clearly: a wrong token or position would show


def test_vocabulary_padding_is_left_out_of_the_softmax(setup: dict[str, Any]) -> None:
    # The model before export: 8 padding rows past the tokenizer's vocabulary, which the export drops.
    model = tiny_llama_config(328).init(jax.random.key(0))
    lm = HalyardLM(model, setup["tokenizer"], batch_size=4, max_length=MAX_LENGTH)
    ours = evaluate_tasks(lm, [TASK], include_path=setup["tasks"], log_samples=True, bootstrap_iters=0)
    _assert_same_examples(ours, setup["reference"], setup)


def test_on_an_fsdp_mesh_through_the_registry_from_the_hf_folder(setup: dict[str, Any]) -> None:
    mesh = MeshSpec(data=1, fsdp=-1).build()
    sharded = _halyard_lm(setup, mesh=mesh, layout=Layout.fsdp(min_shard=1))
    placed = {len(leaf.sharding.device_set) for leaf in jax.tree.leaves(sharded.model)}
    assert placed == {len(jax.devices())}
    ours = evaluate_tasks(sharded, [TASK], include_path=setup["tasks"], log_samples=True, bootstrap_iters=0)
    _assert_same_examples(ours, setup["reference"], setup)

    registered = lm_eval.simple_evaluate(
        model="halyard",
        model_args=f"hf={setup['folder']},max_length={MAX_LENGTH}",
        batch_size=3,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(setup["tasks"]), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    assert registered is not None
    _assert_same_examples(registered, setup["reference"], setup)


def test_rolling_log_likelihoods_match_hflm(setup: dict[str, Any]) -> None:
    requests = [
        Instance("loglikelihood_rolling", {}, (text,), index) for index, text in enumerate(ROLLING_TEXTS)
    ]
    lm = _halyard_lm(setup)
    assert len(lm.tok_encode(ROLLING_TEXTS[1])) > 2 * MAX_LENGTH  # three windows or more
    ours, theirs = lm.loglikelihood_rolling(requests), setup["hf"].loglikelihood_rolling(requests)
    for text, got, expected in zip(ROLLING_TEXTS, ours, theirs, strict=True):
        bound = _loglikelihood_tolerance(setup, text, len(lm.tok_encode(text)))  # every token is scored
        np.testing.assert_allclose(got, expected, atol=bound, rtol=0)


def test_greedy_generation_matches_hflm(setup: dict[str, Any]) -> None:
    kwargs = {"until": ["\n\n"], "max_gen_toks": 10, "do_sample": False}
    requests = [
        Instance("generate_until", {}, (context, dict(kwargs)), index)
        for index, context in enumerate(CONTEXTS)
    ]
    ours = _halyard_lm(setup).generate_until(requests)
    theirs = setup["hf"].generate_until(
        [Instance("generate_until", {}, (r.args[0], dict(kwargs)), r.idx) for r in requests]
    )
    assert ours == theirs
    assert all(len(text) > 0 for text in ours)
