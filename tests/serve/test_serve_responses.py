"""POST /v1/responses driven by the official `openai` client as agents drive it (`responses.create`,
`responses.stream`, `responses.parse`): over a fake engine the response object, its status and
usage, its events numbered and named on the wire, function calls as items and a conversation going
on after them, the reply's form and logprobs; refusals in one line; over the tiny random models the
text is the target's own greedy text, and a seed's reply the seeded autoregressive one."""

import json
import urllib.request

import openai
import pytest
from helpers.serve_helpers import (MODEL, TINY_TOKENIZER, TWO_CALLS, Answer, RecordingGrammars, client, make_app,
                                   prompt_of, serving, serving_recorded)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.structured import call_grammar
from specchat.tui.fake import REPLY, FakeDSIEngine, FakeEngine

PROMPT = "<system>be brief</><user>hi</><assistant>"  # CharTokenizer's template: a character a token
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object"}}


@pytest.fixture
def served():
    """A fake engine served with a recording grammar compiler: yields (engine, compiler, client, url)."""
    with serving_recorded() as (engine, compiler, url):
        yield engine, compiler, client(url), url


def test_a_response_holds_the_reply_as_a_message_with_usage_and_the_specchat_figures(served):
    engine, _, responses, _ = served
    response = responses.responses.create(model=MODEL, input="hi", instructions="be brief", temperature=0.5)
    assert prompt_of(engine) == PROMPT and engine.calls[-1][2].temperature == 0.5
    assert response.output_text == REPLY and response.status == "completed" and response.id.startswith("resp_")
    [message] = response.output
    assert (message.type, message.role, message.status, message.id[:4]) == ("message", "assistant", "completed", "msg_")
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (len(PROMPT), len(REPLY),
                                                                             len(PROMPT) + len(REPLY))
    assert response.temperature == 0.5 and response.instructions == "be brief" and response.store is False
    assert response.model_extra["specchat"]["engine"] == "specexec"


def test_a_stream_is_events_numbered_in_order_that_the_sdk_assembles_into_the_response(served):
    _, _, responses, url = served
    with responses.responses.stream(model=MODEL, input="hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == REPLY and final.status == "completed" and final.usage.output_tokens == len(REPLY)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == REPLY
    request = urllib.request.Request(f"{url}/v1/responses", data=json.dumps(
        {"model": MODEL, "input": "hi", "stream": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as answer:
        frames = [frame for frame in answer.read().decode().split("\n\n") if frame]
    named = [(frame.split("\n")[0], json.loads(frame.split("\n")[1].removeprefix("data: "))["type"])
             for frame in frames]
    assert all(line == f"event: {kind}" for line, kind in named)  # each event named by its type, no [DONE]


def streamed_events(responses, **fields) -> tuple[list, object]:
    """A stream's raw events and the response its last one carries (the SDK's stream helper takes
    only a completed one, where OpenAI's API ends an incomplete reply with response.incomplete)."""
    events = list(responses.create(**fields, stream=True))
    return events, events[-1].response


@pytest.mark.parametrize("stream", [False, True])
def test_running_out_of_tokens_is_an_incomplete_response(served, stream):
    _, _, responses, _ = served
    if stream:
        events, response = streamed_events(responses.responses, model=MODEL, input="hi", max_output_tokens=4)
        assert events[-1].type == "response.incomplete"
        assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == REPLY[:4]
    else:
        response = responses.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    assert response.output_text == REPLY[:4] and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens" and response.output[0].status == "incomplete"


@pytest.mark.parametrize("stream", [False, True])
def test_calls_come_back_as_function_call_items_and_the_conversation_goes_on(stream):
    engine = FakeEngine(reply=TWO_CALLS)
    app, _ = make_app([engine])
    with serving(app) as url:
        responses = client(url).responses
        if stream:
            with responses.stream(model=MODEL, input="hi", tools=[WEATHER]) as events:
                response = events.get_final_response()
        else:
            response = responses.create(model=MODEL, input="hi", tools=[WEATHER])
        assert prompt_of(engine) == "<tools>weather</><user>hi</><assistant>"
        assert [item.type for item in response.output] == ["function_call", "function_call"]  # no text: no message
        assert [(item.name, json.loads(item.arguments)) for item in response.output] == [
            ("weather", {"city": "Paris"}), ("weather", {"city": "Rome"})]
        assert all(item.call_id.startswith("call_") and item.id.startswith("fc_") for item in response.output)
        assert response.status == "completed" and response.output_text == ""
        outputs = [{"type": "function_call_output", "call_id": item.call_id, "output": "sunny"}
                   for item in response.output]
        engine.reply = REPLY
        going_on = responses.create(model=MODEL, tools=[WEATHER], input=[
            {"role": "user", "content": "hi"}, *[item.model_dump() for item in response.output], *outputs])
    assert going_on.output_text == REPLY
    assert prompt_of(engine) == "<tools>weather</><user>hi</><assistant></><tool>sunny</><tool>sunny</><assistant>"


def test_a_forced_call_keeps_the_reply_to_the_calls_grammar_one_call_where_parallel_calls_are_off(served):
    engine, compiler, responses, _ = served
    function = {"name": "weather", "parameters": {"type": "object"}}
    responses.responses.create(model=MODEL, input="hi", tools=[WEATHER], tool_choice="required")
    assert compiler.compiled[-1] == ("lark", call_grammar([function])) and engine.calls[-1][2].guide == "guide 1"
    responses.responses.create(model=MODEL, input="hi", tools=[WEATHER], parallel_tool_calls=False,
                               tool_choice={"type": "function", "name": "weather"})
    assert compiler.compiled[-1] == ("lark", call_grammar([function], one=True))
    responses.responses.create(model=MODEL, input="hi", tools=[WEATHER], tool_choice="none")
    assert prompt_of(engine) == "<user>hi</><assistant>" and engine.calls[-1][2].guide is None  # no tools offered


def test_text_format_keeps_the_reply_to_its_schema_and_parse_returns_the_object(served):
    engine, compiler, responses, _ = served
    engine.reply = '{"answer": 42}'
    parsed = responses.responses.parse(model=MODEL, input="hi", text_format=Answer)
    assert parsed.output_parsed == Answer(answer=42)
    assert compiler.compiled[-1][0] == "schema" and compiler.compiled[-1][1]["properties"] == {
        "answer": {"title": "Answer", "type": "integer"}}
    with pytest.raises(openai.BadRequestError) as refused:
        responses.responses.create(model=MODEL, input="hi", text={"format": {"type": "json_object"}},
                                   extra_body={"grammar": 'root ::= "x"'})
    assert refused.value.body["message"] == "text.format and grammar ask two forms of one reply: send one"


def test_an_engine_that_cannot_keep_a_form_or_logprobs_refuses_them_naming_the_field():
    app, _ = make_app([FakeDSIEngine()], grammars=RecordingGrammars)
    with serving(app) as url:
        responses = client(url).responses
        for fields, param in (({"text": {"format": {"type": "json_object"}}}, "text.format"),
                              ({"include": ["message.output_text.logprobs"]}, "include")):
            with pytest.raises(openai.BadRequestError) as refused:
                responses.create(model=MODEL, input="hi", **fields)
            assert refused.value.body["param"] == param and "under --engine dsi" in refused.value.body["message"]
        assert responses.create(model=MODEL, input="hi").output_text == REPLY


def test_bad_requests_are_one_line_400s_and_a_wrong_model_a_404(served):
    engine, _, responses, _ = served
    with pytest.raises(openai.BadRequestError) as refused:
        responses.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as refused:
        responses.responses.create(model=MODEL, input=[{"type": "web_search_call"}])
    assert refused.value.body["param"] == "input[0]"
    with pytest.raises(openai.NotFoundError):
        responses.responses.create(model="other", input="hi")
    assert engine.calls == []


# The tiny random models: what the route sends is exactly what the engine decodes.


@pytest.mark.parametrize("sampling", [SamplingParams(0.0), SamplingParams(temperature=1.0, top_p=0.9, seed=7)])
def test_on_tiny_models_the_text_is_the_targets_own_with_its_logprobs(tiny_target, tiny_draft, sampling):
    """SpecExec behind /v1/responses: greedy, the target's greedy text; seeded, the seeded
    autoregressive text; streamed the same; each token's logprob, the likeliest first where greedy."""
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    prompt_ids = TINY_TOKENIZER.apply_chat_template([{"role": "user", "content": "hello there"}], True, True,
                                                    True)["input_ids"]
    fields = {"model": MODEL, "input": "hello there", "max_output_tokens": 24, "temperature": sampling.temperature,
              "top_p": sampling.top_p, "extra_body": {"seed": sampling.seed}}
    with serving(app) as url:
        responses = client(url).responses
        whole = responses.create(**fields, include=["message.output_text.logprobs"], top_logprobs=2)
        events, streamed = streamed_events(responses, **fields)
    expected = AutoregressiveEngine(tiny_target, frozenset()).generate(prompt_ids, 24, sampling)
    text = TINY_TOKENIZER.decode([t for e in expected for t in e.token_ids])
    assert whole.output_text == streamed.output_text == text and whole.status == streamed.status == "incomplete"
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == text
    assert whole.model_extra["specchat"]["gen_rate"] > 1  # the tree engine did accept drafts
    logprobs = whole.output[0].content[0].logprobs
    assert "".join(entry.token for entry in logprobs) == whole.output_text
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in logprobs)
    if sampling.temperature == 0:
        assert all(entry.top_logprobs[0].token == entry.token for entry in logprobs)
