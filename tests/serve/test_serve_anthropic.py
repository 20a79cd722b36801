"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) driven by Anthropic's own
client, as Claude Code drives it: over a fake engine the message, why it stopped, its usage, the
stream's events (named on the wire) that the SDK assembles, tool_use blocks and a conversation
going on after their results, a forced call's grammar, the key in `x-api-key`, refusals in
Anthropic's shape; over the tiny random models the text is the target's own greedy text, and a
seed's reply the seeded autoregressive one."""

import json
import urllib.error
import urllib.request

import anthropic
import pytest
from helpers.serve_helpers import (MODEL, TINY_TOKENIZER, TWO_CALLS, Answer, make_app, prompt_of, serving,
                                   serving_recorded)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.structured import call_grammar
from specchat.tui.fake import REPLY, FakeEngine

KEY = "sesame"
HI = [{"role": "user", "content": "hi"}]
PROMPT = "<system>be brief</><user>hi</><assistant>"  # CharTokenizer's template: a character a token
WEATHER = {"name": "weather", "description": "now", "input_schema": {"type": "object"}}


def client(url: str, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture
def served():
    """A fake engine served behind a key with a recording grammar compiler: yields (engine, compiler, client, url)."""
    with serving_recorded(api_key=KEY) as (engine, compiler, url):
        yield engine, compiler, client(url), url


def test_a_message_holds_the_reply_why_it_stopped_and_its_usage(served):
    engine, _, claude, _ = served
    reply = claude.messages.create(model=MODEL, max_tokens=500, system="be brief", messages=HI,
                                   extra_body={"temperature": 0.5, "top_k": 40})  # the SDK no longer names them
    assert prompt_of(engine) == PROMPT and engine.calls[-1][1] == 500
    assert (engine.calls[-1][2].temperature, engine.calls[-1][2].top_k) == (0.5, 40)
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text == REPLY
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None and reply.id.startswith("msg_")
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (len(PROMPT), len(REPLY))
    assert reply.model_extra["specchat"]["engine"] == "specexec"


def test_a_stream_is_anthropics_events_named_on_the_wire_that_the_sdk_assembles(served):
    _, _, claude, url = served
    with claude.messages.stream(model=MODEL, max_tokens=500, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == REPLY and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(REPLY)
    request = urllib.request.Request(f"{url}/v1/messages", data=json.dumps(
        {"model": MODEL, "max_tokens": 500, "messages": HI, "stream": True}).encode(), headers={"x-api-key": KEY})
    with urllib.request.urlopen(request) as answer:
        frames = [frame.split("\n") for frame in answer.read().decode().split("\n\n") if frame]
    events = [(line.removeprefix("event: "), json.loads(data.removeprefix("data: "))) for line, data in frames]
    assert all(name == event["type"] for name, event in events)
    kinds = [name for name, _ in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == ["content_block_stop",
                                                                                     "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


@pytest.mark.parametrize("stream", [False, True])
def test_the_token_limit_and_a_stop_sequence_say_why_the_reply_stopped(served, stream):
    _, _, claude, _ = served

    def send(**fields):
        if not stream:
            return claude.messages.create(model=MODEL, messages=HI, **fields)
        with claude.messages.stream(model=MODEL, messages=HI, **fields) as events:
            return events.get_final_message()
    short = send(max_tokens=4)
    assert short.content[0].text == REPLY[:4] and short.stop_reason == "max_tokens"
    cut = send(max_tokens=500, stop_sequences=["**", "greet"])
    assert cut.content[0].text == REPLY[:REPLY.index("**")] and cut.stop_reason == "stop_sequence"
    assert cut.stop_sequence == "**"


@pytest.mark.parametrize("stream", [False, True])
def test_calls_are_tool_use_blocks_and_the_conversation_goes_on_after_their_results(stream):
    engine = FakeEngine(reply=TWO_CALLS)
    app, _ = make_app([engine])
    with serving(app) as url:
        claude = client(url)
        if stream:
            with claude.messages.stream(model=MODEL, max_tokens=500, messages=HI, tools=[WEATHER]) as events:
                reply = events.get_final_message()
        else:
            reply = claude.messages.create(model=MODEL, max_tokens=500, messages=HI, tools=[WEATHER])
        assert prompt_of(engine) == "<tools>weather</><user>hi</><assistant>"
        assert reply.stop_reason == "tool_use" and [block.type for block in reply.content] == ["tool_use"] * 2
        assert [(block.name, block.input) for block in reply.content] == [("weather", {"city": "Paris"}),
                                                                           ("weather", {"city": "Rome"})]
        assert len({block.id for block in reply.content}) == 2
        results = [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny"} for block in reply.content]
        engine.reply = REPLY
        going_on = claude.messages.create(model=MODEL, max_tokens=500, tools=[WEATHER], messages=[
            *HI, {"role": "assistant", "content": reply.content}, {"role": "user", "content": results}])
    assert going_on.content[0].text == REPLY
    assert prompt_of(engine) == "<tools>weather</><user>hi</><assistant></><tool>sunny</><tool>sunny</><assistant>"


def test_a_forced_call_keeps_the_reply_to_the_calls_grammar_one_call_where_parallel_use_is_off(served):
    engine, compiler, claude, _ = served
    function = {"name": "weather", "parameters": {"type": "object"}, "description": "now"}
    claude.messages.create(model=MODEL, max_tokens=500, messages=HI, tools=[WEATHER], tool_choice={"type": "any"})
    assert compiler.compiled[-1] == ("lark", call_grammar([function])) and engine.calls[-1][2].guide == "guide 1"
    claude.messages.create(model=MODEL, max_tokens=500, messages=HI, tools=[WEATHER],
                           tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True})
    assert compiler.compiled[-1] == ("lark", call_grammar([function], one=True))
    claude.messages.create(model=MODEL, max_tokens=500, messages=HI, tools=[WEATHER], tool_choice={"type": "none"})
    assert prompt_of(engine) == "<user>hi</><assistant>" and engine.calls[-1][2].guide is None


def test_output_config_keeps_the_reply_to_its_schema_and_parse_returns_the_object(served):
    engine, compiler, claude, _ = served
    engine.reply = '{"answer": 42}'
    parsed = claude.messages.parse(model=MODEL, max_tokens=500, messages=HI, output_format=Answer)
    assert parsed.parsed_output == Answer(answer=42)
    assert compiler.compiled[-1][0] == "schema" and compiler.compiled[-1][1]["properties"]["answer"]["type"] == \
        "integer"
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=MODEL, max_tokens=500, messages=HI, tools=[WEATHER], tool_choice={"type": "any"},
                               output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert refused.value.body["error"]["message"] == ("output_config.format and a tool_choice that forces a call "
                                                      "ask two forms of one reply: send one")


def test_count_tokens_counts_the_prompt_the_message_would_decode(served):
    engine, _, claude, _ = served
    counted = claude.messages.count_tokens(model=MODEL, system="be brief", messages=HI, tools=[WEATHER])
    claude.messages.create(model=MODEL, max_tokens=4, system="be brief", messages=HI, tools=[WEATHER])
    assert counted.input_tokens == len(engine.calls[-1][0]) == len(f"<tools>weather</>{PROMPT}")


def test_the_key_refusals_and_a_wrong_model_come_in_anthropics_shape(served):
    engine, _, _, url = served
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client(url, "nope").messages.create(model=MODEL, max_tokens=4, messages=HI)
    assert refused.value.body == {"type": "error", "error": {
        "type": "authentication_error", "message": "wrong API key: send the header 'x-api-key: KEY'"}}
    with pytest.raises(anthropic.NotFoundError) as refused:
        client(url).messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=HI)
    assert refused.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(url).messages.create(model=MODEL, max_tokens=4, messages=[{"role": "robot", "content": "hi"}])
    assert refused.value.body["error"]["message"].startswith("messages[0].role: unknown role 'robot'")
    request = urllib.request.Request(f"{url}/v1/messages", data=json.dumps({"model": MODEL, "messages": HI}).encode(),
                                     headers={"x-api-key": KEY})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request)
    assert json.load(missing.value)["error"]["message"] == "max_tokens is required"
    assert engine.calls == []


# The tiny random models: what the route sends is exactly what the engine decodes.


@pytest.mark.parametrize("sampling", [SamplingParams(0.0), SamplingParams(temperature=1.0, top_p=0.9, seed=7)])
def test_on_tiny_models_the_text_is_the_targets_own(tiny_target, tiny_draft, sampling):
    """SpecExec behind /v1/messages: greedy, the target's greedy text; seeded (llama.cpp's `seed`
    beside Anthropic's fields), the seeded autoregressive text; streamed the same."""
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    messages = [{"role": "user", "content": "hello there"}]
    prompt_ids = TINY_TOKENIZER.apply_chat_template(messages, True, True, True)["input_ids"]
    fields = {"model": MODEL, "messages": messages, "max_tokens": 24, "extra_body": {
        "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed}}
    with serving(app) as url:
        whole = client(url).messages.create(**fields)
        with client(url).messages.stream(**fields) as events:
            streamed = "".join(events.text_stream)
    expected = AutoregressiveEngine(tiny_target, frozenset()).generate(prompt_ids, 24, sampling)
    assert whole.content[0].text == streamed == TINY_TOKENIZER.decode([t for e in expected for t in e.token_ids])
    assert whole.stop_reason == "max_tokens" and whole.model_extra["specchat"]["gen_rate"] > 1
