"""OpenAI's Responses API requests (POST /v1/responses), as agents send them (the OpenAI Agents SDK,
Codex and the like): checked as the chat route's are (pydantic, strictly) and mapped onto what it
takes: `instructions` and the `input` items become chat messages (a function call and its output
become the assistant's tool call and the tool's message), the flat function tools become chat
tools, `text.format` a JSON schema. Stateless, as Ollama's and llama.cpp's: a request carries the
whole conversation, so what names a stored response or conversation is refused in one line."""

from typing import Any

from specchat.serve.errors import bad_request, unsupported
from specchat.serve.schema import MAX_TOP_LOGPROBS, ROLES, Decoded, check_role, required_string, text_of, token_limit
from specchat.serve.structured import response_schema, template_calls

LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for the reply's tokens' logprobs
TEXT_PARTS = {"input_text", "output_text", "text", "refusal"}  # a message's text parts, however written


class ResponsesRequest(Decoded):
    input: str | list[Any]
    instructions: str | None = None  # a system message before the input
    max_output_tokens: int | None = None
    tools: list[Any] | None = None  # {"type": "function", "name", "description", "parameters"}
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None  # false: a forced call is one call
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    top_logprobs: int | None = None
    include: list[str] | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None  # a stored prompt template's id


def check_responses_features(request: ResponsesRequest) -> None:
    """What a stateless server cannot do, refused in one line each; top_logprobs in range."""
    if request.previous_response_id is not None:
        raise unsupported("previous_response_id (this server keeps no responses: send the whole conversation in "
                          "input) is", "previous_response_id")
    if request.conversation is not None:
        raise unsupported("conversation (this server keeps no conversations: send it whole in input) is",
                          "conversation")
    if request.background:
        raise unsupported("background (a reply polled for later) is", "background")
    if request.prompt is not None:
        raise unsupported("prompt (a stored prompt template: send its text in instructions and input) is", "prompt")
    if request.top_logprobs is not None and not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {request.top_logprobs})",
                          "invalid_value", "top_logprobs")


def wants_logprobs(request: ResponsesRequest) -> bool:
    return LOGPROBS in (request.include or [])


def output_limit(request: ResponsesRequest) -> int | None:
    """max_output_tokens, None (the room left in the context) where it is left out."""
    if request.max_output_tokens is None:
        return None
    return token_limit("max_output_tokens", request.max_output_tokens)


def text_schema(text: dict[str, Any] | None) -> dict | None:
    """The JSON schema `text.format` asks the reply to keep to, None for free text. Its json_schema
    holds the schema itself, where the chat route's response_format nests it one level down."""
    form = (text or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise bad_request("text.format must be an object: {\"type\": \"text\" | \"json_object\" | \"json_schema\"}",
                          "invalid_type", "text.format")
    if form.get("type") != "json_schema":
        return response_schema(form)
    if not isinstance(form.get("schema"), dict):
        raise bad_request("text.format.schema is required: a JSON schema object", "missing_field", "text.format")
    return form["schema"]


def chat_tools(tools: list[Any] | None) -> list[dict] | None:
    """The function tools in the chat route's form ({"type": "function", "function": {...}}); a
    hosted tool (web search, files, MCP...) is refused."""
    if tools is None:
        return None
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise unsupported(f"tools[{index}]: a tool of type '{kind}' (function tools only) is", f"tools[{index}]")
        converted.append({"type": "function", "function": {key: tool[key] for key in
                                                           ("name", "description", "parameters") if key in tool}})
    return converted


def chat_tool_choice(choice: Any) -> Any:
    """tool_choice in the chat route's form: {"type": "function", "name": N} names the function
    one level up there; "auto", "none" and "required" are the same."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def input_messages(request: ResponsesRequest) -> list[dict]:
    """The conversation as the chat template takes it: `instructions` as the system message, then
    the input's messages; consecutive function calls join the assistant message before them (a
    reply's text and its calls are one message), and each output becomes the tool's message."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    if isinstance(request.input, str):
        return [*messages, {"role": "user", "content": request.input}]
    for index, item in enumerate(request.input):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where}: an input item is an object", "invalid_type", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(message_of(where, item))
        elif kind == "function_call":
            call_of(where, item, messages)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": output_text(where, item.get("output")),
                             "tool_call_id": required_string(where, item, "call_id")})
        elif kind != "reasoning":  # another model's reasoning: this model has none to read it with
            raise unsupported(f"{where}: an input item of type '{kind}' (messages, function calls and their "
                              "outputs only) is", where)
    return messages


def message_of(where: str, item: dict) -> dict:
    role = required_string(where, item, "role")
    check_role(f"{where}", role)
    content = item.get("content")
    if isinstance(content, list):
        content = [{"type": "text", "text": part.get("text")} if isinstance(part, dict) and part.get("type") in
                   TEXT_PARTS else part for part in content]
    return {"role": ROLES[role], "content": text_of(where, content)}


def call_of(where: str, item: dict, messages: list[dict]) -> None:
    """A function call the model made, added to the assistant message it belongs to."""
    call = {"id": required_string(where, item, "call_id"), "type": "function",
            "function": {"name": required_string(where, item, "name"), "arguments": item.get("arguments", "{}")}}
    [converted] = template_calls([call], where)
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    messages[-1].setdefault("tool_calls", []).append(converted)


def output_text(where: str, output: Any) -> str:
    """A function call's output: a string, or text parts."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return text_of(f"{where}.output", [{"type": "text", "text": part.get("text")} if isinstance(part, dict)
                                           and part.get("type") in TEXT_PARTS else part for part in output])
    raise bad_request(f"{where}.output is required: the call's result as a string", "missing_field",
                      f"{where}.output")
