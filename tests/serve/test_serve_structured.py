"""A request's reply form (serve/structured.py): response formats as schemas, forced tools as a
grammar of the template's <tool_call> blocks, calls read back out of a reply, and a streamed
reply's text held once a call begins; each bad form one 400 line."""

import json
import re

import llguidance
import llguidance.hf
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

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
    for tools in ([{"type": "retrieval"}], [{"type": "retrieval", "function": TIME}], ["get_time"],
                  [{"type": "function", "function": {"parameters": {}}}]):
        with pytest.raises(APIError, match=r"tools\[0\]: a tool is") as refused:
            functions_of(tools)
        assert refused.value.status == 400


@pytest.fixture(scope="module")
def calls_tokenizer() -> llguidance.LLTokenizer:
    """Byte-level characters, and <tool_call> and </tool_call> as special tokens, as Qwen2.5 has them."""
    alphabet = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]  # GPT-2's bytes for space and newline
    vocab = {"<unk>": 0, "</s>": 1} | {c: i + 2 for i, c in enumerate(alphabet)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                use_regex=False),
                                                       pre_tokenizers.Split("", behavior="isolated")])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<tool_call>", "</tool_call>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="</s>")
    return llguidance.hf.from_tokenizer(fast, eos_token=1), fast


def test_the_call_grammar_takes_calls_as_the_template_writes_them_and_nothing_else(calls_tokenizer):
    tokenizer, fast = calls_tokenizer
    grammar = call_grammar([WEATHER, TIME])
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar), tokenizer) == ""
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    time = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    two = good + "\n" + time
    for text, accepted in ((good, True), (two, True), (good.replace('"Paris"', "3"), False),
                           (good.replace("get_weather", "get_wether"), False), ("Sure! " + good, False),
                           (good.replace("<tool_call>", "<tool_cal>"), False),
                           (good.replace('"Paris"}}', '"Paris"}, "id": 1}'), False)):  # no other key
        assert matches(calls_tokenizer, grammar, text) == accepted, text
    one = call_grammar([TIME], one=True)  # tool_choice naming one function: one call of it
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(one), tokenizer) == ""
    assert [matches(calls_tokenizer, one, text) for text in (time, time + "\n" + time, good)] == [True, False, False]


def matches(calls_tokenizer, grammar: str, text: str) -> bool:
    """Whether the grammar takes `text`, token by token, whole."""
    tokenizer, fast = calls_tokenizer
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    consumed = matcher.consume_tokens(fast(text, add_special_tokens=False)["input_ids"])
    return bool(consumed) and matcher.is_accepting()


def test_calls_are_read_back_as_openais_tool_calls():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = split_calls(text)
    assert content == "Let me look." and len(calls) == 1
    assert calls[0]["type"] == "function" and re.fullmatch(r"call_[0-9a-f]{24}", calls[0]["id"])  # as OpenAI's
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert split_calls("no calls here") == ("no calls here", [])
    for broken in ("<tool_call>\n{not json}\n</tool_call>", '<tool_call>\n{"arguments": {}}\n</tool_call>',
                   '<tool_call>\n["get_time"]\n</tool_call>'):
        assert split_calls(broken) == (broken, [])  # text that is not a call (no JSON, no name) stays text


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
    assert plain.push("b <") == "b " and plain.push("x") == "<x"  # one character may begin a call too
    assert CallHold().push("<t") == ""  # a reply that begins with what may begin a call
    assert plain.finish() == ("", [])
    assert CallHold().finish("a <to") == ("a <to", [])  # the reply's held-back tail, no call in it


def test_an_assistants_calls_go_back_to_the_template_with_their_arguments_as_objects():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert template_calls(calls, "messages[1]") == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    for call in ({"type": "function", "function": {"arguments": "{}"}}, {"type": "function"}, "get_weather"):
        with pytest.raises(APIError, match=r"^messages\[1\].tool_calls\[0\]: a call is"):
            template_calls([call], "messages[1]")
    with pytest.raises(APIError, match=r"messages\[1\].tool_calls\[0\].function.arguments is not JSON"):
        template_calls([{"type": "function", "function": {"name": "f", "arguments": "{"}}], "messages[1]")
