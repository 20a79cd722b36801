"""A Responses API request mapped onto the chat route's terms (serve/responses_request.py): its
input items as chat messages, its flat tools and tool_choice as the chat's, text.format as a
schema; what a stateless server cannot do, and malformed items, one 400 line each."""

import pytest
from helpers.serve_helpers import refusal

from specchat.serve.responses_request import (ResponsesRequest, chat_tool_choice, chat_tools,
                                              check_responses_features, input_messages, output_limit, text_schema,
                                              wants_logprobs)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
FLAT = {"type": "function", "name": "get_weather", "description": "now", "parameters": SCHEMA, "strict": True}


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi"} | fields)


def test_a_string_input_is_the_users_message_after_the_instructions():
    assert input_messages(request()) == [{"role": "user", "content": "hi"}]
    assert input_messages(request(instructions="be brief")) == [{"role": "system", "content": "be brief"},
                                                                {"role": "user", "content": "hi"}]


def test_an_agents_conversation_becomes_the_chats_messages():
    """As the OpenAI Agents SDK sends a turn after two parallel calls: typed messages with text
    parts, the assistant's text then its calls (one chat message), each call's output as the
    tool's message naming the call, another model's reasoning left out."""
    items = [
        {"role": "developer", "content": "use tools"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris "},
                                                        {"type": "input_text", "text": "and Rome?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21 C"}]},
    ]
    calls = [{"id": f"call_{n}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
             for n, city in ((1, "Paris"), (2, "Rome"))]
    assert input_messages(request(input=items)) == [
        {"role": "system", "content": "use tools"}, {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": calls},
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
        {"role": "tool", "content": "21 C", "tool_call_id": "call_2"}]
    alone = [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]
    assert input_messages(request(input=alone)) == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                             "function": {"name": "f", "arguments": {}}}]}]


@pytest.mark.parametrize(("item", "message", "param"), [
    ({"type": "item_reference", "id": "msg_1"}, "input[0]: an input item of type 'item_reference' (messages, "
     "function calls and their outputs only) is not supported by specchat", "input[0]"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
     "images, audio and files are not supported by specchat", "input[0].content"),
    ({"role": "wizard", "content": "hi"}, "input[0].role: unknown role 'wizard': use system, user, assistant or tool",
     "input[0].role"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id is required: a string",
     "input[0].call_id"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"},
     "input[0].tool_calls[0].function.arguments is not JSON", "input[0].tool_calls"),
    ({"type": "function_call_output", "call_id": "c"}, "input[0].output is required: the call's result as a string",
     "input[0].output"),
    ("hi", "input[0]: an input item is an object", "input[0]"),
])
def test_a_malformed_or_unsupported_item_is_one_400_line(item, message, param):
    assert refusal(input_messages, request(input=[item])) == (400, message, param)


def test_function_tools_and_tool_choice_take_the_chats_form():
    assert chat_tools(None) is None
    assert chat_tools([FLAT]) == [{"type": "function", "function": {"name": "get_weather", "description": "now",
                                                                     "parameters": SCHEMA}}]
    assert chat_tool_choice({"type": "function", "name": "get_weather"}) == {"type": "function",
                                                                             "function": {"name": "get_weather"}}
    assert [chat_tool_choice(choice) for choice in ("auto", "none", "required", None)] == ["auto", "none",
                                                                                        "required", None]
    assert refusal(chat_tools, [FLAT, {"type": "web_search"}]) == (
        400, "tools[1]: a tool of type 'web_search' (function tools only) is not supported by specchat", "tools[1]")


def test_text_format_is_the_schema_itself_or_any_object_or_free_text():
    assert text_schema(None) is None and text_schema({"format": {"type": "text"}}) is None
    assert text_schema({"format": {"type": "json_object"}}) == {"type": "object"}
    assert text_schema({"format": {"type": "json_schema", "name": "w", "schema": SCHEMA, "strict": True}}) == SCHEMA
    assert refusal(text_schema, {"format": {"type": "json_schema", "name": "w"}}) == (
        400, "text.format.schema is required: a JSON schema object", "text.format")
    assert refusal(text_schema, {"format": "json"})[1].startswith("text.format must be an object")


@pytest.mark.parametrize(("fields", "message", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id (this server keeps no responses: send the whole "
     "conversation in input) is not supported by specchat", "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation (this server keeps no conversations: send it whole in input) is "
     "not supported by specchat", "conversation"),
    ({"background": True}, "background (a reply polled for later) is not supported by specchat", "background"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt (a stored prompt template: send its text in instructions and input) is "
     "not supported by specchat", "prompt"),
    ({"top_logprobs": 21}, "top_logprobs must be in [0, 20] (got 21)", "top_logprobs"),
])
def test_what_a_stateless_server_cannot_do_is_one_400_line(fields, message, param):
    assert refusal(check_responses_features, request(**fields)) == (400, message, param)


def test_store_background_false_and_limits_are_taken():
    check_responses_features(request(store=True, background=False, top_logprobs=20, include=["reasoning.x"]))
    assert output_limit(request()) is None and output_limit(request(max_output_tokens=64)) == 64
    assert refusal(output_limit, request(max_output_tokens=0))[2] == "max_output_tokens"
    assert not wants_logprobs(request(top_logprobs=3))
    assert wants_logprobs(request(include=["message.output_text.logprobs"]))
