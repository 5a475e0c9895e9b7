"""``tools`` and ``tool_choice``: the function definitions a chat template renders, the grammar of a call the
request demands, and the calls read back out of the model's text.

The tools go to the model's own chat template (its ``tools`` variable, as transformers'
``apply_chat_template(tools=...)`` passes them). ``auto`` leaves the model free and reads calls in the forms the
common templates teach: Qwen2.5's and Hermes' ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks, SmolLM2's ``<tool_call>[{...}, ...]</tool_call>`` lists, and Llama-3's bare
``{"name": ..., "parameters": {...}}`` (after an optional ``<|python_tag|>``). ``required`` and a named
function constrain the output with a grammar, as vLLM does: a named function's output is its arguments
(JSON valid under its ``parameters``), ``required``'s a JSON list of ``{"name", "parameters"}`` calls, each
valid under its function's ``parameters``. ``none`` renders no tools and returns text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from collections.abc import Callable
from typing import Any

from halyard.serve.grammar import Grammar, GrammarError, Grammars
from halyard.serve.server.errors import APIError

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One function call the model made: its name and its arguments as JSON text."""

    name: str
    arguments: str

    def as_dict(self, index: int | None = None) -> dict[str, Any]:
        """The call as OpenAI returns it (``index`` for a stream's delta)."""
        call: dict[str, Any] = {
            "id": f"call_{secrets.token_hex(12)}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses its tools.

    Attributes:
        functions: each function's name -> its ``parameters`` schema.
        definitions: the ``tools`` as the chat template receives them (None: none rendered).
        choice: ``auto``, ``required``, or the name of the function that must be called.
        grammar: the grammar of ``required`` and a named function (None for ``auto``).
    """

    functions: dict[str, dict[str, Any]]
    definitions: list[dict[str, Any]] | None
    choice: str
    grammar: Grammar | None

    def calls(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The message content and the calls in a finished answer's ``text`` (no calls: the text whole)."""
        if self.choice not in ("auto", "required"):  # a named function: the text is its arguments
            return None, [ToolCall(self.choice, _compact(text))]
        if self.choice == "required":
            try:
                items = json.loads(text)
            except json.JSONDecodeError:
                return text, []  # cut by max_tokens
            return None, self._known(items)
        return parse_tool_calls(text, self.functions)

    def _known(self, items: Any) -> list[ToolCall]:
        return [
            call for call in map(_call, items if isinstance(items, list) else [items]) if call is not None
        ]


def _compact(text: str) -> str:
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except json.JSONDecodeError:
        return text  # cut by max_tokens: the arguments as far as they got


def _call(item: Any) -> ToolCall | None:
    """A call from ``{"name", "arguments" | "parameters"}`` (None: not that shape)."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        return ToolCall(item["name"], arguments)
    return ToolCall(item["name"], json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(text: str, functions: dict[str, Any]) -> tuple[str | None, list[ToolCall]]:
    """The content and the calls of a free answer, in the forms the module docstring lists; a call of a
    function not in ``functions``, or one that is not JSON, leaves the text as content."""
    items: list[Any] = []
    blocks = TOOL_CALL_BLOCK.findall(text)
    try:
        if blocks:
            for block in blocks:
                parsed = json.loads(block)
                items += parsed if isinstance(parsed, list) else [parsed]
            content: str | None = TOOL_CALL_BLOCK.sub("", text).strip() or None
        else:
            bare = text.strip().removeprefix("<|python_tag|>").strip()
            if not bare.startswith("{"):
                return text, []
            items, content = [json.loads(bare)], None
    except json.JSONDecodeError:
        return text, []
    calls = [_call(item) for item in items]
    if not calls or any(call is None or call.name not in functions for call in calls):
        return text, []
    return content, [call for call in calls if call is not None]


def tool_plan(
    tools: list[Any] | None, tool_choice: Any, parallel: bool | None, compiler: Callable[[], Grammars]
) -> ToolPlan | None:
    """The plan of a request's ``tools`` and ``tool_choice`` (None: no tools, or ``none``); ``compiler``
    gives the grammar compiler when the choice needs a grammar.

    Raises:
        APIError: a malformed tool or choice, a named function that is not among the tools, or parameters
            the grammar library cannot compile (param ``tools`` or ``tool_choice``).
    """
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise APIError("tool_choice: needs tools; send tools or leave tool_choice out", "tool_choice")
        return None
    functions = _functions(tools)
    choice = _choice(tool_choice, functions)
    if choice == "none":
        return None
    try:
        grammar = None
        if choice == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "parameters": parameters},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for name, parameters in functions.items()
            ]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
            schema = schema if parallel is not False else {**schema, "maxItems": 1}
            grammar = compiler().json_schema(schema, "tools")
        elif choice != "auto":
            grammar = compiler().json_schema(functions[choice], "tools")
    except GrammarError as error:
        raise APIError(str(error), error.parameter) from None
    definitions = [{"type": "function", "function": tool["function"]} for tool in tools]
    return ToolPlan(functions, definitions, choice, grammar)


def _functions(tools: list[Any]) -> dict[str, dict[str, Any]]:
    functions: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(
                f"tools: tool {index} must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                "{...}}}",
                "tools",
            )
        parameters = function.get("parameters") or EMPTY_PARAMETERS
        if not isinstance(parameters, dict):
            raise APIError(
                f"tools[{index}].function.parameters: must be a JSON schema object", f"tools[{index}]"
            )
        functions[function["name"]] = parameters
    return functions


def _choice(tool_choice: Any, functions: dict[str, Any]) -> str:
    if tool_choice is None:
        return "auto"
    if tool_choice in ("none", "auto", "required"):
        return str(tool_choice)
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
    if not isinstance(name, str):
        raise APIError(
            "tool_choice: must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if name not in functions:
        raise APIError(
            f"tool_choice: function {name!r} is not among the tools ({', '.join(functions)})", "tool_choice"
        )
    return name
