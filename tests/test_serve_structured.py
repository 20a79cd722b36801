"""A request's reply form (serve/structured.py): response formats as schemas, forced tools as a
grammar of the template's <tool_call> blocks, calls read back out of a reply, and a streamed
reply's text held once a call begins; each bad form one 400 line."""

import json

import llguidance
import pytest

from specchat.serve.errors import APIError
from specchat.serve.structured import (CallHold, call_grammar, forced_functions, functions_of, response_schema,
                                       split_calls, template_calls)

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]


def test_response_formats_are_schemas():
    assert response_schema(None) is None and response_schema({"type": "text"}) is None
    assert response_schema({"type": "json_object"}) == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert response_schema({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}) \
        == schema


@pytest.mark.parametrize(("form", "message"), [
    ({"type": "yaml"}, "response_format.type: 'yaml' is not one of text, json_object, json_schema"),
    ({"type": "json_schema"}, "response_format.json_schema.schema is required: a JSON schema object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}},
     "response_format.json_schema.schema is required: a JSON schema object"),
])
def test_a_bad_response_format_is_one_400_line(form, message):
    with pytest.raises(APIError) as refused:
        response_schema(form)
    assert refused.value.status == 400 and refused.value.message == message


def test_tool_choice_picks_the_functions_a_reply_must_call():
    functions = functions_of(TOOLS)
    assert forced_functions(functions, None) == forced_functions(functions, "auto") == []
    assert forced_functions(functions, "none") == []
    assert forced_functions(functions, "required") == [WEATHER, TIME]
    assert forced_functions(functions, {"type": "function", "function": {"name": "get_time"}}) == [TIME]
    for choice in ({"type": "function", "function": {"name": "nope"}}, "always"):
        with pytest.raises(APIError, match="naming one of the request's tools"):
            forced_functions(functions, choice)
    with pytest.raises(APIError, match="tool_choice required: the request has no tools"):
        forced_functions([], "required")
    with pytest.raises(APIError, match=r"tools\[0\]: a tool is"):
        functions_of([{"type": "retrieval"}])


def test_the_call_grammar_takes_calls_as_the_template_writes_them_and_nothing_else():
    grammar = call_grammar([WEATHER, TIME])
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    bytes_of = llguidance.LLTokenizer("byte")  # one token per byte: the grammar judges the text itself
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    two = good + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    for text, accepted in ((good, True), (two, True), (good.replace("Paris", "3").replace('"3"', "3"), False),
                           (good.replace("get_weather", "get_wether"), False), ("Sure! " + good, False)):
        matcher = llguidance.LLMatcher(bytes_of, grammar)
        consumed = matcher.consume_tokens(list(text.encode()))
        assert (consumed and matcher.is_accepting()) == accepted, text


def test_calls_are_read_back_as_openais_tool_calls():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = split_calls(text)
    assert content == "Let me look." and len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert split_calls("no calls here") == ("no calls here", [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert split_calls(broken) == (broken, [])  # text that is not a call stays text


def test_a_streamed_reply_is_sent_until_a_call_begins():
    hold = CallHold()
    assert hold.push("It is ") == "It is "
    assert hold.push("sunny <tool") == "sunny "  # "<tool" may begin a call: it waits
    assert hold.push("_call>\n{\"name\": \"get_time\", ") == ""
    assert hold.push("\"arguments\": {}}\n</tool_call>") == ""
    rest, calls = hold.finish()
    assert rest == "" and [call["function"]["name"] for call in calls] == ["get_time"]
    plain = CallHold()
    assert plain.push("a <to") == "a " and plain.push("e") == "<toe"
    assert plain.finish() == ("", [])


def test_an_assistants_calls_go_back_to_the_template_with_their_arguments_as_objects():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert template_calls(calls, "messages[1]") == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    with pytest.raises(APIError, match=r"messages\[1\].tool_calls\[0\].function.arguments is not JSON"):
        template_calls([{"type": "function", "function": {"name": "f", "arguments": "{"}}], "messages[1]")
