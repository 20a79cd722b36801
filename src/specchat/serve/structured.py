"""A request's form for its reply, as a grammar: a JSON document (`response_format`), or calls of
its tools in the model's own format (Qwen2.5's chat template writes a call as a `<tool_call>`
block holding {"name", "arguments"}); and the calls read back out of the reply's text."""

import json
import re
import uuid
from typing import Any

from specchat.serve.errors import bad_request

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(TOOL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CLOSE), re.DOTALL)


def response_schema(response_format: dict[str, Any] | None) -> dict | None:
    """The JSON schema a reply must satisfy (any object for json_object), None for free text."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise bad_request(f"response_format.type: '{kind}' is not one of text, json_object, json_schema",
                          "invalid_value", "response_format")
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise bad_request("response_format.json_schema.schema is required: a JSON schema object",
                          "missing_field", "response_format")
    return schema


def functions_of(tools: list[Any] | None) -> list[dict]:
    """Each tool's function ({"name", "description", "parameters"}); a 400 for anything else."""
    functions = []
    for index, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"tools[{index}]: a tool is {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                              "invalid_type", f"tools[{index}]")
        functions.append(function)
    return functions


def offered_functions(tools: list[Any] | None, tool_choice: Any) -> list[dict]:
    """The functions a reply may call, as the chat template declares them: the tools' (a 400 for a
    malformed one), none under tool_choice none."""
    return [] if tool_choice == "none" else functions_of(tools)


def forced_functions(functions: list[dict], tool_choice: Any) -> list[dict]:
    """The functions a reply must call (tool_choice required, or one named), [] where it may answer
    in text (auto, the default, or none)."""
    if tool_choice in (None, "auto", "none"):
        return []
    if tool_choice == "required":
        if not functions:
            raise bad_request("tool_choice required: the request has no tools", "invalid_value", "tool_choice")
        return functions
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    named = function.get("name") if isinstance(function, dict) else None
    chosen = [function for function in functions if function["name"] == named]
    if not chosen:
        raise bad_request("tool_choice: auto, none, required or {\"type\": \"function\", \"function\": {\"name\": N}} "
                          "naming one of the request's tools", "invalid_value", "tool_choice")
    return chosen


def call_grammar(functions: list[dict], one: bool = False) -> str:
    """A Lark grammar (llguidance's dialect: `%json` embeds a schema, a bare <name> is the special
    token of that name, as Qwen2.5's tokenizer holds <tool_call>) of one or more calls (`one`: one)
    of `functions`, each a <tool_call> block as the template writes them."""
    options = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                                  "arguments": function.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False} for function in functions]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    more = "" if one else ' ("\\n" call)*'
    return f'start: call{more}\ncall: {TOOL_OPEN} "\\n" %json {json.dumps(schema)} "\\n" {TOOL_CLOSE}\n'


def split_calls(text: str) -> tuple[str | None, list[dict]]:
    """The reply's text before its first tool call (None when empty) and its calls as OpenAI's
    tool_calls; a block that is not a call (unparsable, no name) stays text."""
    calls = []
    for block in CALL.finditer(text):
        try:
            call = json.loads(block.group(1))
        except json.JSONDecodeError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}})
    if not calls:
        return text, []
    content = text[: text.index(TOOL_OPEN)].strip()
    return content or None, calls


def template_calls(tool_calls: list[Any], where: str) -> list[dict]:
    """An assistant message's tool_calls as the chat template takes them (arguments as objects, and
    each call's id where it has one: Mistral's template writes it, and the result's tool_call_id)."""
    calls = []
    for index, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"{where}.tool_calls[{index}]: a call is {{\"type\": \"function\", \"function\": "
                              "{\"name\": ..., \"arguments\": \"{...}\"}}", "invalid_type", f"{where}.tool_calls")
        arguments = function.get("arguments", "{}")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise bad_request(f"{where}.tool_calls[{index}].function.arguments is not JSON", "invalid_value",
                              f"{where}.tool_calls") from None
        named = {"id": call["id"]} if isinstance(call.get("id"), str) else {}
        calls.append(named | {"type": "function", "function": {"name": function["name"], "arguments": parsed}})
    return calls


class CallHold:
    """A streamed reply that may call tools: its text goes out as it comes until a <tool_call>
    begins (a tail that may begin one waits), and from there on it is held: it becomes calls."""

    def __init__(self) -> None:
        self.pending = ""

    def push(self, text: str) -> str:
        """The text now safe to send as content."""
        buffer = self.pending + text
        if TOOL_OPEN in buffer:  # once held, the pending text begins with the call: nothing more goes out
            start = buffer.index(TOOL_OPEN)
            self.pending = buffer[start:]
            return buffer[:start]
        held = max((size for size in range(1, min(len(TOOL_OPEN), len(buffer) + 1))
                    if buffer.endswith(TOOL_OPEN[:size])), default=0)
        self.pending = buffer[len(buffer) - held:]
        return buffer[:len(buffer) - held]

    def finish(self, tail: str = "") -> tuple[str, list[dict]]:
        """At the end, with the reply's held-back `tail`: the text still to send as content (none
        of it from the calls), and the calls."""
        sent = self.push(tail)
        content, calls = split_calls(self.pending)
        return sent + ("" if calls else content or ""), calls
