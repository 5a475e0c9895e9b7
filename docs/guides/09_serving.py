# %% [markdown]
# # Serving: the engine and the OpenAI-compatible server
#
# `halyard.serve` generates with any Halyard model: continuous batching over a paged KV cache, chunked
# prefill, preemption when memory runs out, per-request sampling with seeds, and a deterministic mode in
# which a request's tokens and log-probabilities do not depend on what else runs beside it. `halyard serve`
# puts it behind OpenAI's API. This guide builds a small model with a tokenizer, generates with the engine
# in Python, checks deterministic mode, then serves the model and asks it with the official `openai` client:
#
# ```bash
# python docs/guides/09_serving.py
# ```

# %%
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from openai import OpenAI
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from halyard.export import export_hf
from halyard.models import init_model, model_config
from halyard.serve import Engine, EngineConfig, SamplingParams

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "serving"
WORK.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## A model and a tokenizer
#
# Any `CausalLM` serves: a run's checkpoint (`halyard serve --run RUN`), a Hugging Face folder
# (`--hf FOLDER`), or a model in memory. Here a small random Llama with a character tokenizer (digits and
# `>`), exported as a Hugging Face folder so that the server can load it like a downloaded checkpoint.

# %%
vocabulary = {"<|endoftext|>": 0, **{str(digit): digit + 1 for digit in range(10)}, ">": 11}
tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<|endoftext|>"))
tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # a token per character
tokenizer.decoder = decoders.Fuse()
tokenizer_path = WORK / "tokenizer.json"
tokenizer.save(str(tokenizer_path))
config = model_config(
    "llama", vocab_size=16, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
    max_position=256, initializer_range=0.3,
)  # fmt: skip
model = init_model(config, jax.random.key(0))
folder = export_hf(model, WORK / "hf", tokenizer=str(tokenizer_path), overwrite=True)
print(sorted(path.name for path in folder.iterdir()))

# %% [markdown]
# ## The engine
#
# `EngineConfig` sizes the KV memory (`num_pages` pages of `page_size` tokens), the running batch
# (`max_running`) and the prefill chunks. `generate` runs requests to the end; `add_request` and `step`
# drive it one step at a time (what the server does). The `n` samples of a request share the prompt's
# pages, and every page is free again when the requests end.

# %%
engine = Engine(
    model, EngineConfig(page_size=16, num_pages=64, max_running=8, chunk_size=32, max_context=128)
)
prompts = [[1, 2, 3, 4, 11], [9, 9, 8, 11]]
outputs = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.8, n=3, seed=7, logprobs=True))
for output in outputs:
    for sample in output.samples:
        print(
            output.prompt_token_ids,
            "->",
            sample.token_ids,
            sample.finish_reason,
            np.round(sample.logprobs[:3], 3),
        )
print(
    "pages in use after the requests:",
    engine.pages.in_use,
    "compiled shapes:",
    len(engine.runner.compiled_shapes),
)
assert engine.pages.in_use == 0

# %% [markdown]
# ## Speculative decoding
#
# `speculative="ngram"` (prompt lookup; `halyard serve --speculative ngram`) or `"draft"` with a small model
# of the same tokenizer (`Engine(..., draft=small)`; `--speculative draft=MODEL`) proposes up to
# `speculative_tokens` tokens a decoding row a step, and the same ragged step verifies them, keeping the
# tokens the row would have drawn one at a time: the output is the same with and without (greedy or seeded),
# in fewer steps where the text repeats itself. It costs unpipelined steps and up to K more tokens a
# decoding row (the serve README says what each part costs).

# %%
repeating = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2]]
greedy = SamplingParams(max_tokens=16, temperature=0.0)
sizes = dict(page_size=16, num_pages=64, max_running=8, chunk_size=32, max_context=128)
speculative = Engine(model, EngineConfig(**sizes, speculative="ngram", speculative_tokens=4))
plain_tokens = Engine(model, EngineConfig(**sizes)).generate(repeating, greedy)[0].samples[0].token_ids
assert speculative.generate(repeating, greedy)[0].samples[0].token_ids == plain_tokens
stats = speculative.stats
print(f"{stats.tokens_accepted} of {stats.tokens_proposed} proposals kept: 16 tokens in {stats.steps} steps")

# %% [markdown]
# ## Deterministic mode
#
# XLA's CPU kernels round a row differently at different row counts, so by default a request's log-probs
# can differ in their last bits with the other requests of its batch. `deterministic=True` computes every
# token with arithmetic whose order does not depend on the batch (products in fixed blocks of 32 rows, sums in
# a fixed order, attention folded page by page): the request below gets the same tokens and
# log-probabilities bit for bit alone and among twenty others arriving in another order.

# %%
deterministic = EngineConfig(
    page_size=64, num_pages=96, max_running=64, chunk_size=64, max_context=256, deterministic=True
)
target = ([3, 1, 4, 1, 5, 9, 2, 6, 11], SamplingParams(max_tokens=12, temperature=1.0, seed=3, logprobs=True))
rng = np.random.default_rng(0)
# Smoke size: shorter requests, each within one page: the same property with fewer programs to compile.
prompt_lengths, new_tokens = ((2, 24), (1, 24)) if SMOKE else ((2, 60), (1, 30))
others = [
    (
        [int(t) for t in rng.integers(1, 11, int(rng.integers(*prompt_lengths)))],
        SamplingParams(max_tokens=int(rng.integers(*new_tokens))),
    )
    for _ in range(20)
]
alone = Engine(model, deterministic).generate([target[0]], [target[1]])[0].samples[0]
crowd = (
    Engine(model, deterministic)
    .generate(
        [p for p, _ in others[:7]] + [target[0]] + [p for p, _ in others[7:]],
        [s for _, s in others[:7]] + [target[1]] + [s for _, s in others[7:]],
    )[7]
    .samples[0]
)
assert alone.token_ids == crowd.token_ids
assert np.array_equal(np.float32(alone.logprobs), np.float32(crowd.logprobs))
print("alone and among 20 others: the same tokens and log-prob bits")

# %% [markdown]
# `training_arithmetic=True` adds the training step's batch-invariant arithmetic
# (`halyard.named.nn.batch_invariant`): in a process where XLA fuses no multiply-adds
# (`halyard.named.nn.unfuse_multiply_add()` before JAX starts; `halyard serve --training-arithmetic` and
# `train` for GRPO do it) the log-probs equal those of a training forward pass over the whole sequence traced
# inside `batch_invariant`, bit for bit. That is what reinforcement learning on-policy needs
# ([10_rl](10_rl.md)); it costs about 1.3x the fast mode's time (benchmarks/README.md), so it is off unless
# asked for.

# %% [markdown]
# ## Structured outputs
#
# A grammar makes a model write what a program can parse: the server's `response_format` (a JSON schema, or
# any JSON object), `tools` with `tool_choice: required` or a named function, and the engine's
# `SamplingParams(grammar=...)` all constrain the draw. Each step, each constrained row gets a mask of the
# tokens its grammar allows next (llguidance, on the host), and the step program sets the other logits to
# `-inf` before the filters and the draw. The grammar library reads the vocabulary from the tokenizer's
# `tokenizer.json` (a byte-level one here: the digit tokenizer above has no bytes for `{`). Even a random
# model then writes valid JSON; a sample ends (`stop`) when its grammar is complete.

# %%
from tokenizers import trainers  # noqa: E402

from halyard.serve.grammar import Grammars  # noqa: E402

byte_tokenizer = Tokenizer(models.BPE())
byte_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
byte_tokenizer.decoder = decoders.ByteLevel()
byte_tokenizer.train_from_iterator(
    ['{"city": "Paris", "days": 3}'] * 10,
    trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|end|>"]
    ),
)
byte_vocab = byte_tokenizer.get_vocab_size()
json_model = init_model(config.replace(vocab_size=byte_vocab), jax.random.key(1))
grammars = Grammars(byte_tokenizer.to_str(), byte_vocab, eos_token_ids=[0])
schema = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
json_engine = Engine(json_model, EngineConfig(page_size=16, num_pages=32, max_running=4, max_context=96))
answers = json_engine.generate(
    [byte_tokenizer.encode("weather:").ids] * 2,
    [
        SamplingParams(max_tokens=40, seed=1, grammar=grammars.json_schema(schema, "response_format")),
        SamplingParams(max_tokens=8, seed=1),  # a free request, in the same steps
    ],
)
constrained, free = (byte_tokenizer.decode(answer.samples[0].token_ids) for answer in answers)
print(constrained, answers[0].samples[0].finish_reason, "| free:", repr(free))
assert answers[0].samples[0].finish_reason == "stop" and json.loads(constrained)["city"] in ("Paris", "Rome")

# %% [markdown]
# Through the server, the same is a request field, and `client.beta.chat.completions.parse` with a pydantic
# model works too:
#
# ```python
# client.chat.completions.create(model=..., messages=[...],
#     response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}})
# client.chat.completions.create(model=..., messages=[...], tools=[...], tool_choice="required")
# ```
#
# A step with a constrained row is not pipelined (its next mask needs the token it draws), so the host's
# work no longer overlaps the device's for that step; the packages/serve README lists every cost. `logit_bias`
# (token id -> bias in [-100, 100]) goes through the same adjustment of the logits, and keeps pipelining.

# %% [markdown]
# ## LoRA adapters
#
# One server can serve several LoRA adapters of one base: `halyard serve --run BASE --lora sql=RUN_OR_PEFT_FOLDER
# --lora chat=...`, and a request picks one with `model: sql` (the base's name for the base; `/v1/models`
# lists them all). Requests for different adapters and for the base share one batch: every adapter's A and B
# are stacked beside the base's projections (index 0: zeros, the base), each token carries its request's
# adapter index, and two dense products of width `adapters x rank` add each row's own update
# (`halyard.serve.adapters`). An adapter answers as its merged model does:

# %%
from halyard.models.lora import LoraConfig, init_lora, merge_lora, with_lora  # noqa: E402
from halyard.named import NamedArray  # noqa: E402
from halyard.serve.adapters import with_adapters  # noqa: E402

fresh = init_lora(
    model, LoraConfig(rank=4, alpha=8, target_modules=("q_proj", "v_proj")), key=jax.random.key(2)
)
tuned = {  # B is zero in a fresh adapter (the model unchanged): give it random values, as training would
    name: type(a)(a.lora_a, NamedArray(jax.random.normal(jax.random.key(3), a.lora_b.array.shape), a.lora_b.axes), a.alpha)
    for name, a in fresh.items()
}  # fmt: skip
served = with_adapters(model, [("tuned", tuned)])  # adapter 1
adapter_engine = Engine(served, EngineConfig(page_size=16, num_pages=32, max_running=4, max_context=96))
prompt = tokenizer.encode("1234>").ids
with_adapter, base_only = adapter_engine.generate(
    [prompt] * 2, [SamplingParams(max_tokens=6, temperature=0, adapter=1), SamplingParams(max_tokens=6, temperature=0)]
)  # fmt: skip
merged_engine = Engine(
    merge_lora(with_lora(model, tuned)), EngineConfig(page_size=16, num_pages=32, max_context=96)
)
(merged,) = merged_engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0))
print(
    "adapter:",
    tokenizer.decode(with_adapter.samples[0].token_ids),
    "| base:",
    tokenizer.decode(base_only.samples[0].token_ids),
)
assert with_adapter.samples[0].token_ids == merged.samples[0].token_ids

# %% [markdown]
# ## The server
#
# `halyard serve --hf FOLDER` (or `--run RUN_DIR`) listens on 127.0.0.1 (`--host` to change it,
# `--api-key` to require a bearer token) with `/v1/models`, `/v1/completions`, `/v1/chat/completions`,
# `/health` and `/metrics`. Ctrl-C stops it cleanly. The official client talks to it unchanged:

# %%
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
server = subprocess.Popen(
    [sys.executable, "-m", "halyard.train.cli", "serve", "--hf", str(folder), "--port", str(port),
     "--max-running", "8", "--page-size", "16", "--num-pages", "64", "--max-context", "128", "--model-name", "digits"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
)  # fmt: skip
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
deadline = time.monotonic() + 240
while True:
    try:
        client.models.list()
        break
    except Exception:
        if time.monotonic() > deadline or server.poll() is not None:
            raise
        time.sleep(0.5)
completion = client.completions.create(
    model="digits", prompt="1234>", max_tokens=6, temperature=0, logprobs=2
)
print(repr(completion.choices[0].text), completion.choices[0].finish_reason, completion.usage)
streamed = "".join(
    chunk.choices[0].text
    for chunk in client.completions.create(
        model="digits", prompt="1234>", max_tokens=6, temperature=0, stream=True
    )
    if chunk.choices
)
assert streamed == completion.choices[0].text
server.send_signal(signal.SIGINT)
assert server.wait(timeout=60) == 0
print("server stopped cleanly")
