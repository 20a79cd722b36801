"""Anthropic's Messages API requests (POST /v1/messages, /v1/messages/count_tokens), as Claude Code
and the Anthropic SDK send them: checked as the chat route's are (pydantic, strictly) and mapped onto
its terms. `system` becomes the system message; a message's content blocks become chat messages
(an assistant's `tool_use` blocks its tool calls, a user's `tool_result` blocks the tool's messages,
in their order); tools' `input_schema` their parameters; `tool_choice` auto / any / tool / none the
chat's auto / required / a named function / none; `output_config.format` a JSON schema. Thinking
blocks replayed from another model are left out: this model has no reasoning mode to read them with."""

from typing import Any

from pydantic import Field

from specchat.serve.errors import bad_request, unsupported
from specchat.serve.schema import Decoded, Strict, nonempty_stops, required_string, token_limit
from specchat.serve.structured import template_calls

THINKING = {"thinking", "redacted_thinking"}


class AnthropicMessage(Strict):
    role: str
    content: str | list[Any]


class Conversation(Strict):
    """What a count of tokens and a message both hold."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(Decoded, Conversation):
    """A message to decode. `thinking` is taken as any unknown field is, and no thinking block comes
    back: the model has no reasoning mode."""

    max_tokens: int  # required, as Anthropic's API requires it
    stop_sequences: list[str] | None = None
    output_config: dict[str, Any] | None = None  # {"format": {"type": "json_schema", "schema"}}; its effort is taken


def output_schema(request: MessagesRequest) -> dict | None:
    """The JSON schema `output_config.format` asks the reply to keep to (structured outputs), None for free text."""
    form = (request.output_config or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, dict) or form.get("type") != "json_schema" or not isinstance(form.get("schema"), dict):
        raise bad_request("output_config.format is {\"type\": \"json_schema\", \"schema\": {...}}", "invalid_value",
                          "output_config.format")
    return form["schema"]


def output_limit(request: MessagesRequest) -> int:
    return token_limit("max_tokens", request.max_tokens)


def stop_sequences(request: MessagesRequest) -> list[str]:
    return nonempty_stops(list(request.stop_sequences or []), "stop_sequences")


def chat_tools(tools: list[Any] | None) -> list[dict] | None:
    """The tools in the chat route's form; a server tool (web search, code execution...) is refused."""
    if tools is None:
        return None
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or tool.get("type") not in (None,
                                                                                                          "custom"):
            raise unsupported(f"tools[{index}]: a tool that is not a custom tool {{\"name\", \"input_schema\"}} is",
                              f"tools[{index}]")
        function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        converted.append({"type": "function", "function": function | (
            {"description": tool["description"]} if "description" in tool else {})})
    return converted


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool]:
    """tool_choice as the chat route's, and whether a forced call is one call
    (`disable_parallel_tool_use`)."""
    if choice is None:
        return None, False
    kind, one = choice.get("type"), bool(choice.get("disable_parallel_tool_use"))
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, one
    chosen = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if chosen is None:
        raise bad_request("tool_choice: {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": N}",
                          "invalid_value", "tool_choice")
    return chosen, one


def chat_messages(request: Conversation) -> list[dict]:
    """The conversation as the chat template takes it: the system prompt first, then each message's
    blocks in order."""
    messages = [{"role": "system", "content": system_text(request.system)}] if request.system else []
    for index, message in enumerate(request.messages):
        where = f"messages[{index}]"
        if message.role not in ("user", "assistant"):
            raise bad_request(f"{where}.role: unknown role '{message.role}': use user or assistant (the system "
                              "prompt is the request's `system`)", "invalid_value", f"{where}.role")
        blocks = [{"type": "text", "text": message.content}] if isinstance(message.content, str) else message.content
        messages += (assistant_message if message.role == "assistant" else user_messages)(where, blocks)
    return messages


def system_text(system: str | list[Any]) -> str:
    return system if isinstance(system, str) else "".join(text_block("system", index, block)
                                                          for index, block in enumerate(system))


def user_messages(where: str, blocks: list[Any]) -> list[dict]:
    """A user's turn: its text as user messages, each tool result as the tool's message, in order."""
    messages: list[dict] = []
    for index, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            messages.append({"role": "tool", "content": result_text(f"{where}.content[{index}]", block),
                             "tool_call_id": required_string(f"{where}.content[{index}]", block, "tool_use_id")})
            continue
        text = text_block(where, index, block)
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"] += text
        else:
            messages.append({"role": "user", "content": text})
    return messages


def assistant_message(where: str, blocks: list[Any]) -> list[dict]:
    """The assistant's turn: its text, and its tool_use blocks as its calls."""
    texts, calls = [], []
    for index, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") in THINKING:
            continue
        if isinstance(block, dict) and block.get("type") == "tool_use":
            place = f"{where}.content[{index}]"
            function = {"name": required_string(place, block, "name"), "arguments": block.get("input", {})}
            calls.append({"id": required_string(place, block, "id"), "type": "function", "function": function})
        else:
            texts.append(text_block(where, index, block))
    message = {"role": "assistant", "content": "".join(texts)}
    return [message | {"tool_calls": template_calls(calls, where)} if calls else message]


def text_block(where: str, index: int, block: Any) -> str:
    place = f"{where}.content[{index}]" if where != "system" else f"system[{index}]"
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in ("image", "document", "search_result"):
        raise unsupported("images, documents and search results are", place)
    if kind != "text" or not isinstance(block.get("text"), str):
        raise bad_request(f"{place}: a content block is {{\"type\": \"text\", \"text\": \"...\"}}, a tool_use or a "
                          "tool_result", "invalid_type", place)
    return block["text"]


def result_text(where: str, block: dict) -> str:
    """A tool result's text (a string, or text blocks); an error result says so first."""
    content = block.get("content", "")
    text = content if isinstance(content, str) else "".join(text_block(where, index, part)
                                                            for index, part in enumerate(content))
    return f"Error: {text}" if block.get("is_error") else text
