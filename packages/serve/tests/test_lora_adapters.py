"""LoRA adapters served beside their base (`halyard.serve.adapters`, ``--lora NAME=FOLDER``): requests for
different adapters and for the base share one batch; each adapter's answers equal PEFT's merged model's
(greedy tokens equal, log-probs within the bound of two implementations' summation orders); deterministic
mode keeps a request's bits whatever adapters the other rows run; bad adapters are one-line errors."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import openai
import pytest
from float_tolerance import referee_terms, summation_tolerance
from server_fixtures import MODEL_NAME, ServerProcess, start_server, tiny_hf_folder
from tokenizers import Tokenizer

from halyard.export import import_hf
from halyard.models.lora import LoraConfig, init_lora, merge_lora, with_lora
from halyard.named import NamedArray
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.adapters import AdapterError, with_adapters
from halyard.serve.server.cli import main

PROMPT_IDS = [1, 4, 33, 6, 4, 34, 25, 7, 12]
ADAPTERS = {  # name: (rank, alpha, targets, rsLoRA)
    "sql": (4, 8, ["q_proj", "v_proj", "down_proj"], False),
    "chat": (2, 3, ["k_proj", "o_proj", "gate_proj", "up_proj"], True),
}


def _peft_adapter(
    base: Path, folder: Path, seed: int, rank: int, alpha: int, targets: list[str], rs: bool
) -> Any:
    """A PEFT LoRA adapter of ``base`` with random A and B, saved to ``folder``; returns peft's merged model."""
    import peft
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False, use_rslora=rs
    )
    adapted = peft.get_peft_model(model, config)
    adapted.save_pretrained(folder)
    return adapted.merge_and_unload().eval()


def _greedy(merged: Any, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of ``prompt`` (the full forward at each step) and its log-probs."""
    import torch

    tokens, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            row = torch.log_softmax(merged(torch.tensor([tokens])).logits[0, -1].double(), -1)
            tokens.append(int(row.argmax()))
            logprobs.append(float(row[tokens[-1]]))
    return tokens[len(prompt) :], logprobs


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], dict[str, Any]]:
    root = tmp_path_factory.mktemp("lora")
    base = tiny_hf_folder(root / "base", seed=5)
    adapters, merged = {}, {}
    for seed, (name, (rank, alpha, targets, rs)) in enumerate(ADAPTERS.items()):
        adapters[name] = root / name
        merged[name] = _peft_adapter(base, adapters[name], seed, rank, alpha, targets, rs)
    return base, adapters, merged


@pytest.fixture(scope="module")
def server(folders: tuple[Path, dict[str, Path], Any]) -> Iterator[ServerProcess]:
    base, adapters, _ = folders
    options = [f"--lora={name}={folder}" for name, folder in adapters.items()]
    started = start_server(base, base.parent / "server.log", *options)
    yield started
    assert started.stop() == 0, started.output()[-3000:]


def test_each_adapter_answers_as_peft_merged_model_in_one_shared_batch(
    server: ServerProcess, folders: tuple[Path, dict[str, Path], dict[str, Any]]
) -> None:
    base, _, merged = folders
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    assert [m.id for m in client.models.list().data] == [MODEL_NAME, *ADAPTERS]
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    config = import_hf(base)[0]

    def ask(name: str) -> Any:
        return client.completions.create(
            model=name,
            prompt=PROMPT_IDS,
            max_tokens=8,
            temperature=0,
            logprobs=1,
            extra_body={"ignore_eos": True},
        )

    with concurrent.futures.ThreadPoolExecutor(6) as pool:  # the base's and both adapters' rows side by side
        answers = list(pool.map(ask, [*ADAPTERS, MODEL_NAME] * 2))
    for name, answer in zip([*ADAPTERS, MODEL_NAME] * 2, answers, strict=True):
        (choice,) = answer.choices
        assert answer.model == name
        if name == MODEL_NAME:
            assert choice.text == answers[2].choices[0].text
            continue
        tokens, logprobs = _greedy(merged[name], PROMPT_IDS, 8)
        assert choice.text == tokenizer.decode(tokens), name
        # two implementations' orders of every sum (referee_terms), the log-softmax's over the vocabulary,
        # and the adapter's rank-r sums taken apart from (here) or inside (merged) each adapted weight
        rank, _, targets, _ = ADAPTERS[name]
        terms = referee_terms(config, len(PROMPT_IDS) + 8) + config.vocab_size
        terms += config.shape.layers * len(targets) * (rank + max(config.shape.embed, config.shape.mlp))
        bound = summation_tolerance(logprobs, terms)
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        np.testing.assert_allclose(choice.logprobs.token_logprobs, logprobs, atol=bound, rtol=0)
    assert answers[0].choices[0].text != answers[1].choices[0].text != answers[2].choices[0].text
    with pytest.raises(openai.NotFoundError) as raised:  # OpenAI's answer to a model it does not serve
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "the"}])
    assert raised.value.status_code == 404 and raised.value.code == "model_not_found"
    assert "'sql'" in str(raised.value) and client.models.retrieve("chat").id == "chat"


def test_bad_adapters_are_one_line_errors(
    folders: tuple[Path, dict[str, Path], Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import shutil

    base, adapters, _ = folders
    wrong_rank = tmp_path / "wrong-rank"
    shutil.copytree(adapters["sql"], wrong_rank)
    config = json.loads((wrong_rank / "adapter_config.json").read_text())
    (wrong_rank / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    dora = tmp_path / "dora"
    shutil.copytree(adapters["sql"], dora)
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    cases = {
        f"tiny={adapters['sql']}": "is the base model's name",
        f"sql={wrong_rank}": "a rank-8 adapter of the served model needs",
        f"sql={dora}": "use_dora",
        f"sql={tmp_path}": "holds neither adapter_config.json",
        "sql": "give NAME=FOLDER",
    }
    for value, expected in cases.items():
        assert main(["--hf", str(base), "--model-name", MODEL_NAME, "--lora", value]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: --lora") and expected in error and error.count("\n") == 1, error
    twice = ["--lora", f"a={adapters['sql']}", "--lora", f"a={adapters['chat']}"]
    assert main(["--hf", str(base), *twice]) == 2 and "given twice" in capsys.readouterr().err


def _random_adapters(model: Any, seed: int, rank: int, targets: tuple[str, ...]) -> Any:
    adapters = init_lora(
        model, LoraConfig(rank=rank, alpha=2.0 * rank, target_modules=targets), key=jax.random.key(seed)
    )
    return {
        name: type(a)(
            a.lora_a,
            NamedArray(jax.random.normal(jax.random.key(seed + 7), a.lora_b.array.shape), a.lora_b.axes),
            a.alpha,
        )
        for name, a in adapters.items()
    }


def test_deterministic_bits_do_not_depend_on_the_other_rows_adapters() -> None:
    from tiny_models import tiny_model

    base = tiny_model("llama")
    first = _random_adapters(base, 1, 4, ("q_proj", "v_proj"))
    second = _random_adapters(base, 2, 8, ("o_proj", "down_proj", "k_proj"))
    served = with_adapters(base, [("first", first), ("second", second)])
    config = EngineConfig(page_size=4, num_pages=64, max_context=64, max_running=4, deterministic=True)
    engine = Engine(served, config)
    params = SamplingParams(max_tokens=6, temperature=0.7, seed=3, logprobs=True, adapter=1)
    (alone,) = engine.generate([PROMPT_IDS], params)
    others = [SamplingParams(max_tokens=6, temperature=0.0, logprobs=True, adapter=a) for a in (2, 0, 2)]
    (base_alone,) = engine.generate([PROMPT_IDS], others[1])  # steps of base rows only: no adapter products
    # the same prompt under other adapters (their pages apart in the prefix cache), in the same steps
    *mixed, among = engine.generate([PROMPT_IDS] * 4, [*others, params])
    for together, apart in ((among, alone), (mixed[1], base_alone)):
        assert together.samples[0].token_ids == apart.samples[0].token_ids
        assert np.array_equal(together.samples[0].logprobs, apart.samples[0].logprobs)  # bitwise
    reference = Engine(merge_lora(with_lora(base, second)), config)
    (merged,) = reference.generate([PROMPT_IDS], dataclasses.replace(others[0], adapter=0))
    assert mixed[0].samples[0].token_ids == merged.samples[0].token_ids
    with pytest.raises(AdapterError, match="does not fit the served model"):
        with_adapters(tiny_model("llama", hidden_size=16), [("first", first)])
