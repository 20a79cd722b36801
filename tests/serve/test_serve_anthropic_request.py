"""An Anthropic Messages API request mapped onto the chat route's terms (serve/anthropic_request.py):
its system prompt and content blocks as chat messages, in order; its tools and tool_choice as the
chat's; malformed or unsupported blocks, one 400 line each."""

import pytest
from helpers.serve_helpers import refusal

from specchat.serve.anthropic_request import (MessagesRequest, chat_messages, chat_tool_choice, chat_tools,
                                              output_limit, output_schema, stop_sequences)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def request(messages: list[dict], **fields) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 16, "messages": messages} | fields)


def test_a_string_message_is_the_users_after_the_system_prompt_in_either_form():
    hi = [{"role": "user", "content": "hi"}]
    assert chat_messages(request(hi)) == [{"role": "user", "content": "hi"}]
    for system in ("be brief", [{"type": "text", "text": "be "}, {"type": "text", "text": "brief",
                                                                  "cache_control": {"type": "ephemeral"}}]):
        assert chat_messages(request(hi, system=system))[0] == {"role": "system", "content": "be brief"}


def test_claude_codes_turns_become_the_chats_messages_in_order():
    """As Claude Code sends a turn after two parallel calls: the assistant's thinking left out, its
    text then its calls (one chat message, input objects as arguments), each result as the tool's
    message naming its call (an error's text marked), then the user's text after them."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Paris "}, {"type": "text", "text": "and Rome?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "...", "signature": "x"}, {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no station"}]},
            {"type": "text", "text": "And now?"}]},
    ]
    calls = [{"id": f"toolu_{n}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
             for n, city in ((1, "Paris"), (2, "Rome"))]
    assert chat_messages(request(messages)) == [
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": calls},
        {"role": "tool", "content": "18 C", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: no station", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "And now?"}]


@pytest.mark.parametrize(("message", "text", "param"), [
    ({"role": "system", "content": "hi"}, "messages[0].role: unknown role 'system': use user or assistant (the "
     "system prompt is the request's `system`)", "messages[0].role"),
    ({"role": "user", "content": [{"type": "image", "source": {}}]},
     "images, documents and search results are not supported by specchat", "messages[0].content[0]"),
    ({"role": "user", "content": [{"type": "txt", "text": "hi"}]}, "messages[0].content[0]: a content block is "
     "{\"type\": \"text\", \"text\": \"...\"}, a tool_use or a tool_result", "messages[0].content[0]"),
    ({"role": "user", "content": [{"type": "tool_result", "content": "x"}]},
     "messages[0].content[0].tool_use_id is required: a string", "messages[0].content[0].tool_use_id"),
    ({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]},
     "messages[0].content[0].name is required: a string", "messages[0].content[0].name"),
])
def test_a_malformed_or_unsupported_block_is_one_400_line(message, text, param):
    assert refusal(chat_messages, request([message])) == (400, text, param)


def test_tools_and_tool_choice_take_the_chats_form():
    tool = {"name": "get_weather", "description": "now", "input_schema": SCHEMA}
    assert chat_tools(None) is None
    assert chat_tools([tool]) == [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA,
                                                                     "description": "now"}}]
    assert chat_tools([{"name": "f"}])[0]["function"]["parameters"] == {"type": "object"}
    assert refusal(chat_tools, [tool, {"type": "web_search_20250305", "name": "web_search"}]) == (
        400, "tools[1]: a tool that is not a custom tool {\"name\", \"input_schema\"} is not supported by specchat",
        "tools[1]")
    assert chat_tool_choice(None) == (None, False)
    assert chat_tool_choice({"type": "auto"}) == ("auto", False)
    assert chat_tool_choice({"type": "any", "disable_parallel_tool_use": True}) == ("required", True)
    assert chat_tool_choice({"type": "none"}) == ("none", False)
    assert chat_tool_choice({"type": "tool", "name": "f"}) == ({"type": "function", "function": {"name": "f"}}, False)
    assert refusal(chat_tool_choice, {"type": "some"})[2] == "tool_choice"


def test_the_limit_and_stop_sequences_are_checked():
    hi = [{"role": "user", "content": "hi"}]
    assert output_limit(request(hi)) == 16 and stop_sequences(request(hi, stop_sequences=["\n\n"])) == ["\n\n"]
    assert refusal(output_limit, request(hi, max_tokens=0))[2] == "max_tokens"
    assert refusal(stop_sequences, request(hi, stop_sequences=[""]))[2] == "stop_sequences"


def test_output_config_format_is_a_json_schema_and_its_effort_alone_asks_none():
    hi = [{"role": "user", "content": "hi"}]
    assert output_schema(request(hi)) is None and output_schema(request(hi, output_config={"effort": "low"})) is None
    form = {"format": {"type": "json_schema", "schema": SCHEMA}}
    assert output_schema(request(hi, output_config=form)) == SCHEMA
    assert refusal(output_schema, request(hi, output_config={"format": {"type": "yaml"}})) == (
        400, "output_config.format is {\"type\": \"json_schema\", \"schema\": {...}}", "output_config.format")
