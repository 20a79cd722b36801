"""Ollama's API, driven by Ollama's own client (`ollama`, as oterm drives it): /api/chat and
/api/generate streamed as lines of JSON by default or whole, their options mapped onto the job,
tool calls with their arguments as objects, the model's card in /api/tags, /api/show and /api/ps,
refusals as Ollama's {"error"} in one line; on the tiny models the reply is the engine's greedy text,
and the `context` an answer carries, sent back, goes on from it on the slot's caches."""

import json
import urllib.error
import urllib.request

import ollama
import pytest
from helpers.serve_helpers import MODEL, TINY_TOKENIZER, make_app, prompt_of, serving

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.schema import Defaults
from specchat.tui.fake import REPLY, FakeEngine

USER_HELLO = [{"role": "user", "content": "hello there"}]
USER = [{"role": "user", "content": "hi"}]
PROMPT = "<user>hi</><assistant>"  # CharTokenizer's template: a character a token
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>.'


@pytest.fixture
def fake():
    engine = FakeEngine()
    app, _ = make_app([engine])
    with serving(app) as url:
        yield engine, ollama.Client(host=url, timeout=60), url


def test_a_chat_streams_lines_of_json_by_default_and_ends_with_ollamas_counts(fake):
    engine, client, _ = fake
    parts = list(client.chat(model=MODEL, messages=USER, stream=True))
    assert "".join(part.message.content for part in parts) == REPLY and prompt_of(engine) == PROMPT
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    end = parts[-1]
    assert end.done_reason == "stop" and end.message.role == "assistant"
    assert (end.prompt_eval_count, end.eval_count) == (len(PROMPT), len(REPLY))
    assert end.total_duration >= end.prompt_eval_duration > 0 and end.eval_duration >= 0  # ns


def test_a_chat_not_streamed_is_one_object_and_the_wire_is_ndjson(fake):
    _, client, url = fake
    reply = client.chat(model=f"{MODEL}:latest", messages=USER, stream=False)  # Ollama's tag names it too
    assert reply.message.content == REPLY and reply.done and reply.done_reason == "stop"
    request = urllib.request.Request(f"{url}/api/chat", data=json.dumps({"model": MODEL, "messages": USER}).encode())
    with urllib.request.urlopen(request) as response:
        lines = response.read().decode().splitlines()
        assert response.headers["Content-Type"].startswith("application/x-ndjson")
    assert all(json.loads(line)["model"] == MODEL for line in lines) and json.loads(lines[-1])["done"]


def test_the_options_set_the_sampling_the_limit_and_the_stops(fake):
    engine, client, _ = fake
    options = {"temperature": 0.3, "top_p": 0.7, "top_k": 40, "min_p": 0.05, "typical_p": 0.9, "seed": 5,
               "num_predict": 30, "stop": ["**"], "num_ctx": 8192, "dynatemp_range": 0.2}
    reply = client.chat(model=MODEL, messages=USER, options=options)
    assert engine.calls[-1][1:] == (30, SamplingParams(temperature=0.3, top_p=0.7, seed=5, top_k=40, min_p=0.05,
                                                       typical_p=0.9, dynatemp_range=0.2))
    assert reply.message.content == REPLY[:REPLY.index("**")] and reply.done_reason == "stop"
    reply = client.chat(model=MODEL, messages=USER, options={"num_predict": 4})
    assert reply.message.content == REPLY[:4] and reply.done_reason == "length"
    client.chat(model=MODEL, messages=USER, options={"num_predict": -1})
    assert engine.calls[-1][1] == 4096 - len(PROMPT)  # -1: to the end of the context


def test_generate_templates_the_prompt_unless_raw_and_streams_the_response(fake):
    engine, client, _ = fake
    assert client.generate(model=MODEL, prompt="hi", stream=False).response == REPLY
    assert prompt_of(engine) == PROMPT
    parts = list(client.generate(model=MODEL, prompt="hi", system="be brief", stream=True))
    assert "".join(part.response for part in parts) == REPLY and parts[-1].done_reason == "stop"
    assert prompt_of(engine) == "<system>be brief</><user>hi</><assistant>"
    client.generate(model=MODEL, prompt="def f(", raw=True)
    assert prompt_of(engine) == "def f("


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_comes_back_with_its_arguments_as_an_object(stream):
    engine = FakeEngine(reply=CALL)
    app, _ = make_app([engine])
    with serving(app) as url:
        reply = ollama.Client(host=url).chat(model=MODEL, messages=USER, tools=[WEATHER], stream=stream)
        parts = list(reply) if stream else [reply]
    assert prompt_of(engine) == f"<tools>weather</>{PROMPT}"
    assert "".join(part.message.content for part in parts) == ""  # the call is not text
    calls = [call for part in parts for call in part.message.tool_calls or []]
    assert [(call.function.name, dict(call.function.arguments)) for call in calls] == [("weather", {"city": "Paris"})]
    assert parts[-1].done_reason == "stop"


def test_a_conversation_goes_on_after_a_call_with_the_tools_reply(fake):
    """Ollama's assistant call (arguments as an object) and the tool's reply (named by tool_name,
    where OpenAI's names the call) reach the chat template."""
    engine, client, _ = fake
    call = {"function": {"name": "weather", "arguments": {"city": "Paris"}}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "sunny", "tool_name": "weather"}]
    assert client.chat(model=MODEL, messages=messages, tools=[WEATHER]).message.content == REPLY
    assert prompt_of(engine) == "<tools>weather</><user>hi</><assistant></><tool>sunny</><assistant>"


def test_the_model_card_tags_show_and_ps(fake):
    _, client, url = fake
    assert [model.model for model in client.list().models] == [MODEL]
    shown = client.show(MODEL)
    assert shown.template == "<role>content</>" and "completion" in shown.capabilities
    lines = shown.parameters.splitlines()
    assert "num_ctx 4096" in lines and not any(line.startswith("seed") for line in lines)  # drawn each request
    assert not any(line.startswith(("top_k", "min_p", "typical_p")) for line in lines)  # no cut: nothing to list
    assert [(model.model, model.context_length) for model in client.ps().models] == [(MODEL, 4096)]
    with urllib.request.urlopen(f"{url}/api/version") as response:
        assert json.load(response)["version"]


def test_show_lists_the_servers_cuts_and_seed_as_a_modelfile_would():
    app, _ = make_app([FakeEngine()], sampling=Defaults(temperature=0.3, top_p=0.8, seed=3, top_k=40, min_p=0.05,
                                                        typical_p=0.9))
    with serving(app) as url:
        lines = ollama.Client(host=url, timeout=60).show(MODEL).parameters.splitlines()
    assert lines == ["temperature 0.3", "top_p 0.8", "top_k 40", "min_p 0.05", "typical_p 0.9", "seed 3",
                     "num_ctx 4096"]


def test_show_lists_the_servers_penalties_and_their_window_where_set():
    app, _ = make_app([FakeEngine()], sampling=Defaults(temperature=0.3, top_p=0.8, repeat_penalty=1.1,
                                                        repeat_last_n=32, presence_penalty=0.5))
    with serving(app) as url:
        lines = ollama.Client(host=url, timeout=60).show(MODEL).parameters.splitlines()
    assert lines == ["temperature 0.3", "top_p 0.8", "repeat_penalty 1.1", "presence_penalty 0.5",
                     "repeat_last_n 32", "num_ctx 4096"]


def test_nothing_to_decode_loads_the_model_as_ollama_answers(fake):
    engine, client, _ = fake
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"
    assert client.generate(model=MODEL, prompt="").done_reason == "load"
    assert engine.calls == []


@pytest.mark.parametrize(("call", "status", "fragment"), [
    (lambda c: c.chat(model="llama3", messages=USER), 404, "model 'llama3' not found: this server serves 'tiny'"),
    (lambda c: c.show("llama3"), 404, "model 'llama3' not found"),
    (lambda c: c.chat(model=MODEL, messages=[{"role": "robot", "content": "x"}]), 400, "unknown role 'robot'"),
    (lambda c: c.chat(model=MODEL, messages=USER, think=True), 400, "this model does not think"),
    (lambda c: c.chat(model=MODEL, messages=USER, options={"temperature": 9.0}), 400, "temperature must be"),
    (lambda c: c.chat(model=MODEL, messages=USER, format="json"), 400, "format: this server's tokenizer takes no"),
    (lambda c: c.generate(model=MODEL, prompt="x", images=["aGk="]), 400, "images are not supported"),
    (lambda c: c.generate(model=MODEL, prompt="x", context=[1, -2]), 400, "context: token id -2 is outside"),
    (lambda c: c.generate(model=MODEL, prompt="x", raw=True, system="y"), 400, "a raw prompt reaches the model as it"),
    (lambda c: c.generate(model=MODEL, prompt="x", suffix="y"), 400, "suffix: this model has no fill-in-the-middle"),
])
def test_refusals_are_ollamas_error_in_one_line(fake, call, status, fragment):
    _, client, _ = fake
    with pytest.raises(ollama.ResponseError) as refused:
        call(client)
    assert refused.value.status_code == status and fragment in refused.value.error and "\n" not in refused.value.error


@pytest.mark.parametrize(("body", "fragment"), [
    ({"options": {"temperature": "hot"}}, "options.temperature: input should be a valid number"),
    ({"format": "yaml"}, "format: 'yaml' is neither \"json\" nor a JSON schema"),
    ({"options": {"num_predict": 0}}, "options.num_predict must be"),
    ("[1]", "the request body must be a JSON object"),
])
def test_what_ollamas_client_would_not_send_is_refused_in_one_line_too(fake, body, fragment):
    _, _, url = fake
    data = body if isinstance(body, str) else json.dumps({"model": MODEL, "messages": USER} | body)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/chat", data=data.encode()))
    error = json.load(refused.value)["error"]
    assert refused.value.code == 400 and fragment in error and "\n" not in error, error


def test_the_key_guards_ollamas_routes():
    app, _ = make_app([FakeEngine()], api_key="secret")
    with serving(app) as url:
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=url).list()
        assert refused.value.status_code == 401 and "API key" in refused.value.error
        keyed = ollama.Client(host=url, headers={"Authorization": "Bearer secret"})
        assert keyed.chat(model=MODEL, messages=USER, stream=False).message.content == REPLY


def test_on_tiny_models_the_reply_is_the_greedy_text_with_the_targets_logprobs(tiny_target, tiny_draft):
    """SpecExec behind /api/generate (raw) at temperature 0: the target's greedy tokens, each with
    its log-probability and its likeliest alternatives, the emitted token the likeliest."""
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        reply = ollama.Client(host=url).generate(model=MODEL, prompt="hello there", raw=True, logprobs=True,
                                                 top_logprobs=2, options={"temperature": 0, "num_predict": 12})
    events = AutoregressiveEngine(tiny_target, frozenset()).generate(TINY_TOKENIZER.encode("hello there"), 12,
                                                                     SamplingParams(0.0))
    assert reply.response == TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])
    assert "".join(entry.token for entry in reply.logprobs) == reply.response and reply.done_reason == "length"
    assert all(entry.top_logprobs[0].token == entry.token and len(entry.top_logprobs) == 2 for entry in reply.logprobs)


def test_on_tiny_models_a_context_sent_back_goes_on_from_the_answer_it_came_with(tiny_target, tiny_draft):
    """Ollama's `context` (the older clients' way to go on): the answer's last object carries the
    prompt's and the reply's token ids, streamed or not; sent back, the next prompt goes after them,
    reusing the slot's caches up to its last token, and the reply is the target's greedy text
    there. A raw answer carries none."""
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    options = {"temperature": 0, "num_predict": 8}
    with serving(app) as url:
        client = ollama.Client(host=url)
        first = client.generate(model=MODEL, prompt="hello there", options=options)
        streamed = list(client.generate(model=MODEL, prompt="hello there", options=options, stream=True))
        second = client.generate(model=MODEL, prompt="go on", context=first.context, options=options)
        raw = client.generate(model=MODEL, prompt="hello", raw=True, options=options)
    prompt = TINY_TOKENIZER.apply_chat_template(USER_HELLO, True, True, True)["input_ids"]
    assert first.context == streamed[-1].context == prompt + TINY_TOKENIZER.encode(first.response)
    assert all(part.context is None for part in streamed[:-1]) and raw.context is None
    then = first.context + TINY_TOKENIZER.apply_chat_template([{"role": "user", "content": "go on"}], True, True,
                                                               True)["input_ids"]
    assert second.context[:len(then)] == then
    assert second.prompt_eval_count == len(then) - len(first.context) + 1  # the context's tokens reused but one
    events = AutoregressiveEngine(tiny_target, frozenset()).generate(then, 8, SamplingParams(0.0))
    assert second.response == TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])
