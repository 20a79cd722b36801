"""Logit bias and repetition penalties on every route: each API's fields and windows reach the
engine, refusals are one line (a 400 naming the field), an engine that cannot keep them refuses
before anything is queued, and on the tiny models a served reply under them is autoregressive
decoding's under the same penalties."""

import json
import urllib.error
import urllib.request

import ollama
import pytest
from helpers.serve_helpers import MODEL, TINY_TOKENIZER, client, make_app, serving, serving_engine, user

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.penalties import Penalties, Window
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.native_request import NativeRequest
from specchat.serve.penalty_fields import llama_penalties, openai_penalties
from specchat.serve.schema import ChatRequest, Defaults
from specchat.tui.fake import FakeDSIEngine, FakeEngine


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def spec_of(engine) -> Penalties | None:
    state = engine.calls[-1][2].penalties
    return None if state is None else state.penalties


@pytest.fixture
def fake():
    engine = FakeEngine()
    with serving_engine(engine) as url:
        yield engine, url


def test_openai_routes_take_openais_penalties_vllms_repetition_and_logit_bias(fake):
    engine, url = fake
    client(url).chat.completions.create(model=MODEL, messages=user("hi"), presence_penalty=0.5,
                                        frequency_penalty=-0.25, logit_bias={"104": -100, "105": 3},
                                        extra_body={"repetition_penalty": 1.2})
    assert spec_of(engine) == Penalties(bias=((104, -100.0), (105, 3.0)), repeat=1.2, presence=0.5, frequency=-0.25,
                                        repeat_window=Window(), count_window=Window(prompt=False))
    state = engine.calls[-1][2].penalties
    assert state.repeated.counts[ord("h")] == 1 and not state.counted.counts  # the prompt counts for repetition only
    client(url).completions.create(model=MODEL, prompt="abc", frequency_penalty=1.0)
    assert spec_of(engine) == Penalties(frequency=1.0, repeat_window=Window(last=64), count_window=Window(prompt=False))


def test_openai_routes_also_take_llama_servers_repeat_penalty_over_its_window(fake):
    """llama-server's OpenAI routes take its own field names: its clients send them in extra_body."""
    engine, url = fake
    client(url).chat.completions.create(model=MODEL, messages=user("hi"), presence_penalty=0.5,
                                        extra_body={"repeat_penalty": 1.1, "repeat_last_n": 16})
    assert spec_of(engine) == Penalties(repeat=1.1, repeat_window=Window(last=16), presence=0.5,
                                        count_window=Window(prompt=False))
    status, body = post(f"{url}/v1/chat/completions", {"model": MODEL, "messages": user("hi"),
                                                       "repeat_penalty": 1.1, "repetition_penalty": 1.2})
    assert status == 400 and "give one" in body["error"]["message"] and body["error"]["param"] == "repeat_penalty"


def test_nothing_set_or_all_off_is_no_penalty(fake):
    engine, url = fake
    client(url).chat.completions.create(model=MODEL, messages=user("hi"))
    client(url).chat.completions.create(model=MODEL, messages=user("hi"), presence_penalty=0, frequency_penalty=0,
                                        extra_body={"repetition_penalty": 1})
    assert [call[2].penalties for call in engine.calls] == [None, None]


def test_llama_cpps_routes_count_the_last_64_of_prompt_and_reply_for_all_three(fake):
    engine, url = fake
    assert post(f"{url}/completion", {"prompt": "aab", "n_predict": 2, "repeat_penalty": 1.1,
                                      "presence_penalty": 0.2, "logit_bias": [[97, False], ["b", 1.5]]})[0] == 200
    window = Window(last=64)
    assert spec_of(engine) == Penalties(bias=((97, -float("inf")), (98, 1.5)), repeat=1.1, presence=0.2,
                                        repeat_window=window, count_window=window)
    assert engine.calls[-1][2].penalties.counted.counts == {97: 2, 98: 1}
    post(f"{url}/completion", {"prompt": "x", "n_predict": 2, "frequency_penalty": 0.3, "repeat_last_n": -1,
                               "logit_bias": {"120": 2, "x": 1}})
    assert spec_of(engine) == Penalties(bias=((120, 3.0),), frequency=0.3, repeat_window=Window(),
                                        count_window=Window())


def test_ollamas_options_take_llama_cpps_penalties(fake):
    engine, url = fake
    ollama.Client(host=url, timeout=60).chat(model=MODEL, messages=user("hi"),
                                             options={"repeat_penalty": 1.3, "repeat_last_n": 8,
                                                      "frequency_penalty": 0.1})
    assert spec_of(engine) == Penalties(repeat=1.3, frequency=0.1, repeat_window=Window(last=8),
                                        count_window=Window(last=8))


BAD = [
    ("/v1/chat/completions", {"presence_penalty": 2.5}, "presence_penalty",
     "presence_penalty must be between -2 and 2"),
    ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty",
     "repetition_penalty must be in (0, 100]"),
    ("/v1/chat/completions", {"logit_bias": [[1, 2]]}, "logit_bias", "logit_bias must be an object"),
    ("/v1/chat/completions", {"logit_bias": {"abc": 1}}, "logit_bias", "'abc' is not a token id"),
    ("/v1/chat/completions", {"logit_bias": {"2000000": 1}}, "logit_bias", "token 2000000 is not in the vocabulary"),
    ("/v1/chat/completions", {"logit_bias": {"5": 101}}, "logit_bias", "must be between -100 and 100 (got 101.0)"),
    ("/v1/chat/completions", {"logit_bias": {"5": "high"}}, "logit_bias", "the bias of '5' must be a number"),
    ("/completion", {"repeat_last_n": -2}, "repeat_last_n", "repeat_last_n must be between -1"),
    ("/completion", {"logit_bias": [[1, 2, 3]]}, "logit_bias", "a list of [token, bias] pairs"),
    ("/completion", {"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty must be between -2 and 2"),
]


@pytest.mark.parametrize(("path", "fields", "param", "fragment"), BAD)
def test_a_penalty_out_of_range_is_a_400_naming_its_field(fake, path, fields, param, fragment):
    engine, url = fake
    base = {"model": MODEL, "messages": user("hi")} if path.startswith("/v1") else {"prompt": "hi", "n_predict": 2}
    status, body = post(f"{url}{path}", {**base, **fields})
    error = body["error"]
    assert status == 400 and error["param"] == param and fragment in error["message"], error
    assert engine.calls == []


def test_an_engine_that_keeps_no_forms_refuses_penalties_before_anything_is_queued():
    engine = FakeDSIEngine()
    app, _ = make_app([engine])
    with serving(app) as url:
        status, body = post(f"{url}/v1/chat/completions", {"model": MODEL, "messages": user("hi"),
                                                           "frequency_penalty": 0.5})
    error = body["error"]
    assert status == 400 and error["param"] == "frequency_penalty" and "--engine dsi" in error["message"]
    assert engine.calls == []


def test_on_tiny_models_a_penalized_served_reply_is_autoregressive_decodings(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    body = {"prompt": "hello there", "n_predict": 24, "temperature": 0, "repeat_penalty": 1.5, "repeat_last_n": 16,
            "presence_penalty": 0.5, "logit_bias": [[TINY_TOKENIZER.encode("e")[0], 2.0]]}
    with serving(app) as url:
        status, served = post(f"{url}/completion", body)
        plain = post(f"{url}/completion", {"prompt": "hello there", "n_predict": 24, "temperature": 0})[1]
    prompt_ids = TINY_TOKENIZER.encode("hello there")
    asked = llama_penalties(NativeRequest.model_validate(body), TINY_TOKENIZER, Defaults(), body["logit_bias"])
    sampling = SamplingParams(0.0, penalties=asked.penalties.start(prompt_ids))
    events = AutoregressiveEngine(tiny_target, frozenset()).generate(prompt_ids, 24, sampling)
    assert status == 200 and served["content"] == TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])
    assert served["content"] != plain["content"]  # the penalties changed the reply


def test_penalties_that_change_nothing_ask_for_nothing():
    request = ChatRequest.model_validate({"model": MODEL, "messages": user("hi"), "presence_penalty": 0})
    assert openai_penalties(request, TINY_TOKENIZER, Defaults()) is None
    assert llama_penalties(NativeRequest.model_validate({"repeat_penalty": 1.0}), TINY_TOKENIZER, Defaults()) is None
    server = Defaults(repeat_penalty=1.2, presence_penalty=0.5)  # a request may turn the server's off
    assert openai_penalties(ChatRequest.model_validate({"model": MODEL, "messages": user("hi"), "repeat_penalty": 1,
                                                        "presence_penalty": 0}), TINY_TOKENIZER, server) is None
    assert llama_penalties(NativeRequest.model_validate({"repeat_penalty": 1, "presence_penalty": 0}), TINY_TOKENIZER,
                           server) is None


SERVER = Defaults(repeat_penalty=1.3, repeat_last_n=16, presence_penalty=0.5, frequency_penalty=0.1)
SERVER_WINDOW = Window(last=16)


@pytest.fixture
def penalizing():
    """`serve --repeat-penalty 1.3 --repeat-last-n 16 --presence-penalty 0.5 --frequency-penalty 0.1`."""
    engine = FakeEngine()
    with serving_engine(engine, sampling=SERVER) as url:
        yield engine, url


def test_the_servers_penalties_are_what_a_request_leaves_out_over_its_window(penalizing):
    """As llama-server's options: every route, in llama.cpp's window, the request's own fields winning."""
    engine, url = penalizing
    server = Penalties(repeat=1.3, presence=0.5, frequency=0.1, repeat_window=SERVER_WINDOW,
                       count_window=SERVER_WINDOW)
    client(url).chat.completions.create(model=MODEL, messages=user("hi"))
    assert spec_of(engine) == server
    post(f"{url}/completion", {"prompt": "x", "n_predict": 2})
    assert spec_of(engine) == server
    ollama.Client(host=url, timeout=60).generate(model=MODEL, prompt="x", options={"num_predict": 2})
    assert spec_of(engine) == server
    post(f"{url}/completion", {"prompt": "x", "n_predict": 2, "repeat_penalty": 1.1, "repeat_last_n": 4})
    assert spec_of(engine) == Penalties(repeat=1.1, presence=0.5, frequency=0.1, repeat_window=Window(last=4),
                                        count_window=Window(last=4))
    ollama.Client(host=url, timeout=60).chat(model=MODEL, messages=user("hi"), options={"frequency_penalty": 0})
    assert spec_of(engine) == Penalties(repeat=1.3, presence=0.5, repeat_window=SERVER_WINDOW,
                                        count_window=SERVER_WINDOW)


def test_on_openai_routes_a_requests_presence_or_frequency_sets_the_pair_in_openais_window(penalizing):
    engine, url = penalizing
    client(url).chat.completions.create(model=MODEL, messages=user("hi"), presence_penalty=0.2)
    assert spec_of(engine) == Penalties(repeat=1.3, repeat_window=SERVER_WINDOW, presence=0.2,
                                        count_window=Window(prompt=False))
    client(url).completions.create(model=MODEL, prompt="abc", extra_body={"repetition_penalty": 1.05})
    assert spec_of(engine) == Penalties(repeat=1.05, repeat_window=Window(), presence=0.5, frequency=0.1,
                                        count_window=SERVER_WINDOW)


def test_a_server_whose_engine_keeps_no_forms_refuses_its_own_penalties_at_start():
    from specchat.errors import SpecchatError
    from specchat.serve.command import check_kept

    check_kept(Defaults(), FakeDSIEngine())
    check_kept(SERVER, FakeEngine())
    with pytest.raises(SpecchatError, match="--engine dsi cannot penalize repeats: serve with specexec"):
        check_kept(Defaults(frequency_penalty=0.1), FakeDSIEngine())
    with pytest.raises(SpecchatError, match="leave out --repeat-penalty, --presence-penalty, --frequency-penalty and "
                                            "--dry-multiplier"):
        check_kept(Defaults(dry_multiplier=0.5), FakeDSIEngine())
