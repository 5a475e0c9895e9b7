"""Structured outputs, logit_bias and tool calls through the official ``openai`` client against one
``halyard-serve`` subprocess (deterministic mode) serving a random tiny Llama with a byte-level BPE tokenizer
and Qwen2.5's chat template: a random model writes JSON only because the grammar makes it; every answer that
ends with ``stop`` validates against its schema (``jsonschema``, the referee)."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jsonschema
import openai
import pydantic
import pytest
from server_fixtures import MODEL_NAME, ServerProcess, start_server
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from halyard.export import export_hf
from halyard.models import init_model, model_config
from halyard.serve.server.tools import parse_tool_calls

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]  # Qwen2.5's: added tokens, not special (they stay in the text)
QWEN25_TEMPLATE = (  # Qwen2.5-Instruct's chat template (tools, tool calls, tool responses)
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}{%- endif %}{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the "
    'user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}{{- "\\n</tools>\\n\\nFor each '
    "function call, return a json object with function name and arguments within <tool_call></tool_call> XML "
    'tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n\" }}{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    '{%- endif %}{%- endif %}{%- for message in messages %}{%- if (message.role == "user") or (message.role '
    '== "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}'
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}{%- if message.content %}"
    "{{- '\\n' + message.content }}{%- endif %}{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    '{%- elif message.role == "tool" %}{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != '
    "\"tool\") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' }}{{- message.content }}"
    "{{- '\\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CORPUS = [
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    '{"answer": true, "count": 12, "word": "hello"}',
    "the weather in Paris is warm and the sky is blue",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "word": {"type": "string", "enum": ["yes", "no", "maybe"]},
    },
    "required": ["answer", "count", "word"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
MESSAGES = [{"role": "user", "content": "what is the weather in Paris"}]


def byte_level_folder(folder: Path) -> Path:
    """A random tiny Llama with a byte-level BPE tokenizer (every string has tokens) and Qwen2.5's template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=640, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIALS
    )
    tools = "\n".join(json.dumps(tool) for tool in (WEATHER, TIME))
    tokenizer.train_from_iterator([*CORPUS, QWEN25_TEMPLATE, tools] * 20, trainer)
    tokenizer.add_tokens(TOOL_TAGS)
    tokenizer_folder = folder.parent / f"{folder.name}-tokenizer"
    tokenizer_folder.mkdir(parents=True)
    tokenizer.save(str(tokenizer_folder / "tokenizer.json"))
    settings = {
        "eos_token": "<|im_end|>",
        "chat_template": QWEN25_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (tokenizer_folder / "tokenizer_config.json").write_text(json.dumps(settings))
    config = model_config(
        "llama", vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=48, num_layers=2,
        num_heads=4, num_kv_heads=2, max_position=512, initializer_range=0.3,
    )  # fmt: skip
    export_hf(init_model(config, jax.random.key(5)), folder, tokenizer=tokenizer_folder)
    return folder


@pytest.fixture(scope="module")
def byte_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return byte_level_folder(tmp_path_factory.mktemp("structured") / "tiny")


@pytest.fixture(scope="module")
def byte_tokenizer(byte_folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(byte_folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def structured_server(byte_folder: Path) -> Iterator[ServerProcess]:
    folder = byte_folder
    started = start_server(
        folder,
        folder.parent / "server.log",
        "--max-context",
        "384",
        "--num-pages",
        "320",
        "--chunk-size",
        "64",
    )
    yield started
    assert started.stop() == 0, started.output()[-3000:]


@pytest.fixture(scope="module")
def api(structured_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=structured_server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def test_json_schema_chat_validates_and_length_cuts(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, n=4, temperature=1.0, seed=1, max_tokens=60,
        response_format=json_schema_format(SCHEMA),  # type: ignore[arg-type]
    )  # fmt: skip
    for choice in answer.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    cut = api.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=3, response_format=json_schema_format(SCHEMA),  # type: ignore[arg-type]
    )  # fmt: skip
    assert cut.choices[0].finish_reason == "length"


def test_json_object_completion_streams_what_it_answers(api: openai.OpenAI) -> None:
    settings: dict[str, Any] = dict(
        model=MODEL_NAME, prompt="the weather", max_tokens=80, temperature=0.7, seed=3,
        extra_body={"response_format": {"type": "json_object"}},
    )  # fmt: skip
    whole = api.completions.create(**settings)
    streamed = list(api.completions.create(stream=True, **settings))
    text = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
    assert text == whole.choices[0].text
    if whole.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a random model may open strings it never closes: cut by max_tokens, said so
        assert whole.choices[0].finish_reason == "length"


def test_constrained_and_free_rows_share_steps_bitwise(api: openai.OpenAI) -> None:
    """Deterministic mode: a free request's tokens and log-probs are the same bits with and without
    constrained neighbours, and a constrained request's are the same bits every time."""

    def free() -> Any:
        return api.completions.create(
            model=MODEL_NAME, prompt="the sky is", max_tokens=12, temperature=0.8, seed=7, logprobs=1,
            extra_body={"ignore_eos": True},
        ).choices[0]  # fmt: skip

    def constrained() -> Any:
        return api.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=40, seed=9, logprobs=True,
            response_format=json_schema_format(SCHEMA),  # type: ignore[arg-type]
        ).choices[0]  # fmt: skip

    alone = free()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(constrained) for _ in range(3)] + [pool.submit(free) for _ in range(2)]
        results = [future.result() for future in futures]
    for mixed in results[3:]:
        assert mixed.text == alone.text and mixed.logprobs.token_logprobs == alone.logprobs.token_logprobs
    first = results[0]
    for again in results[1:3]:
        assert again.message.content == first.message.content
        assert [t.logprob for t in again.logprobs.content] == [t.logprob for t in first.logprobs.content]


def test_a_schema_the_library_cannot_compile_is_a_400_with_the_reason(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES,
            response_format=json_schema_format({"type": "object", "properties": {"a": {"type": "bogus"}}}),  # type: ignore[arg-type]
        )  # fmt: skip
    assert raised.value.body["param"] == "response_format" and "bogus" in raised.value.body["message"]  # type: ignore[index]


def test_logit_bias_forces_and_forbids_tokens(api: openai.OpenAI, byte_tokenizer: Tokenizer) -> None:
    settings: dict[str, Any] = dict(
        model=MODEL_NAME,
        prompt=[5, 6, 7],
        max_tokens=4,
        temperature=0,
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    words = [t for t in range(300, 600) if byte_tokenizer.decode([t]).strip().isalpha()][:2]
    either = api.completions.create(logit_bias={str(t): 100 for t in words}, **settings).choices[0]
    preferred = next(t for t in words if byte_tokenizer.decode([t]) == either.logprobs.tokens[0])
    assert either.text == byte_tokenizer.decode([preferred] * 4)
    plain = api.completions.create(**settings).choices[0]
    assert plain.logprobs.token_logprobs[0] >= either.logprobs.token_logprobs[0]  # the model's own log-prob
    spellings: dict[str, list[int]] = {}
    for token in range(byte_tokenizer.get_vocab_size()):
        spellings.setdefault(byte_tokenizer.decode([token], skip_special_tokens=False), []).append(token)
    one_token = {**settings, "max_tokens": 1}
    for prompt in ([5, 6, 7], [8], [9, 10], [11], [12, 13], [14]):  # one whose greedy token has its own text
        greedy = api.completions.create(**{**one_token, "prompt": prompt}).choices[0].logprobs.tokens[0]
        if len(spellings[greedy]) == 1:
            break
    (token,) = spellings[greedy]
    forbidden = api.completions.create(**{**one_token, "prompt": prompt}, logit_bias={str(token): -100})
    assert forbidden.choices[0].logprobs.tokens[0] != greedy


class Answer(pydantic.BaseModel):
    answer: bool
    count: int = pydantic.Field(ge=0, le=99)
    word: str = pydantic.Field(max_length=8)


def test_beta_parse_with_a_pydantic_model(api: openai.OpenAI) -> None:
    parsed = api.beta.chat.completions.parse(
        model=MODEL_NAME, messages=MESSAGES, response_format=Answer, max_tokens=60, temperature=0
    )
    choice = parsed.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Answer)


def test_required_and_named_tool_calls_validate(api: openai.OpenAI) -> None:
    required = api.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, tools=[WEATHER, TIME], tool_choice="required", max_tokens=60,  # type: ignore[list-item]
        temperature=0.9, seed=2, n=3, parallel_tool_calls=False,
    )  # fmt: skip
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (WEATHER, TIME)}  # type: ignore[index]
    for choice in required.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    named = api.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, tools=[WEATHER, TIME], max_tokens=60, seed=4,  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    (call,) = named.choices[0].message.tool_calls or []
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), schemas["get_time"])
    streamed = list(
        api.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, tools=[WEATHER, TIME], max_tokens=60, stream=True, seed=4,  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    )  # fmt: skip
    deltas = [call for chunk in streamed for call in (chunk.choices[0].delta.tool_calls or [])]
    assert [d.function.arguments for d in deltas] == [call.function.arguments]  # type: ignore[union-attr]
    follow_up = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"time": "12:00"}'},
    ]
    reply = api.chat.completions.create(
        model=MODEL_NAME, messages=follow_up, tools=[WEATHER, TIME], max_tokens=5
    )  # type: ignore[arg-type, list-item]
    assert reply.choices[0].finish_reason in ("stop", "length")
    none = api.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, tools=[WEATHER], tool_choice="none", max_tokens=5
    )  # type: ignore[list-item]
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content is not None


def test_tool_calls_are_read_in_each_template_family_form() -> None:
    functions = {"get_weather": {}, "get_time": {}}
    hermes = 'ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_tool_calls(hermes, functions)
    assert content == "ok" and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    smollm = '<tool_call>[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]</tool_call>'
    assert [c.name for c in parse_tool_calls(smollm, functions)[1]] == ["get_time", "get_weather"]
    llama = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}'
    content, calls = parse_tool_calls(llama, functions)
    assert content is None and json.loads(calls[0].arguments) == {"city": "Rome"}
    for text in ('{"name": "unknown", "parameters": {}}', "<tool_call>{not json</tool_call>", "plain words"):
        assert parse_tool_calls(text, functions) == (text, [])


def test_tools_render_as_transformers_renders_them(byte_folder: Path) -> None:
    """The referee of the chat template's ``tools``: transformers' ``apply_chat_template(tools=...)``."""
    import transformers

    from halyard.data import load_tokenizer
    from halyard.serve.server.tokenizer import TextTokenizer

    conversation = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
        {"role": "tool", "content": '{"time": "12:00"}'},
    ]  # fmt: skip
    ours = TextTokenizer(load_tokenizer(str(byte_folder))).render_chat(conversation, [WEATHER, TIME])
    reference = transformers.AutoTokenizer.from_pretrained(byte_folder)
    expected = reference.apply_chat_template(
        conversation, tools=[WEATHER, TIME], tokenize=False, add_generation_prompt=True
    )
    assert ours == expected and "get_weather" in ours and "<tool_response>" in ours
