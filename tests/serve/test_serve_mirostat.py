"""Mirostat on every route (llama.cpp's and Ollama's fields, which llama-server's OpenAI routes take
too): the request's or the server's reach the engine as a fresh state a reply, refusals are one
line, an engine that cannot keep it refuses, and on the tiny models a served reply under it is
autoregressive decoding's."""

import json
import urllib.request

import ollama
import pytest
from helpers.serve_helpers import MODEL, TINY_TOKENIZER, client, post_refused, serving_engine, user

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.mirostat import Mirostat
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError
from specchat.serve.command import check_kept
from specchat.serve.schema import Defaults
from specchat.tui.fake import FakeDSIEngine, FakeEngine


def spec_of(engine) -> Mirostat | None:
    state = engine.calls[-1][2].mirostat
    return None if state is None else state.spec


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def test_each_api_names_mirostat_alike_and_each_request_gets_a_fresh_state():
    engine = FakeEngine()
    with serving_engine(engine) as url:
        client(url).chat.completions.create(model=MODEL, messages=user("hi"),
                                            extra_body={"mirostat": 2, "mirostat_tau": 3.0})
        assert spec_of(engine) == Mirostat(2, 3.0, 0.1) and engine.calls[-1][2].mirostat.mu == 6.0
        first = engine.calls[-1][2].mirostat
        post(f"{url}/completion", {"prompt": "x", "n_predict": 2, "mirostat": 1, "mirostat_eta": 0.3})
        assert spec_of(engine) == Mirostat(1, 5.0, 0.3)
        ollama.Client(host=url, timeout=60).chat(model=MODEL, messages=user("hi"), options={"mirostat": 2})
        assert spec_of(engine) == Mirostat(2) and engine.calls[-1][2].mirostat is not first
        client(url).chat.completions.create(model=MODEL, messages=user("hi"))
        assert spec_of(engine) is None


def test_the_servers_mirostat_is_what_a_request_leaves_out_and_a_request_turns_it_off():
    engine = FakeEngine()
    with serving_engine(engine, sampling=Defaults(mirostat=2, mirostat_tau=4.0)) as url:
        post(f"{url}/completion", {"prompt": "x", "n_predict": 2})
        assert spec_of(engine) == Mirostat(2, 4.0, 0.1)
        post(f"{url}/completion", {"prompt": "x", "n_predict": 2, "mirostat_tau": 6.0})
        assert spec_of(engine) == Mirostat(2, 6.0, 0.1)
        post(f"{url}/completion", {"prompt": "x", "n_predict": 2, "mirostat": 0})
        assert spec_of(engine) is None
        params = json.load(urllib.request.urlopen(f"{url}/props"))["default_generation_settings"]["params"]
        assert (params["mirostat"], params["mirostat_tau"], params["mirostat_eta"]) == (2, 4.0, 0.1)
        lines = ollama.Client(host=url, timeout=60).show(MODEL).parameters.splitlines()
        assert ["mirostat 2", "mirostat_tau 4.0", "mirostat_eta 0.1"] == [line for line in lines if "mirostat" in line]


@pytest.mark.parametrize(("fields", "param", "fragment"), [
    ({"mirostat": 3}, "mirostat", "mirostat must be between 0 and 2 (got 3)"),
    ({"mirostat": 2, "mirostat_tau": -1.0}, "mirostat_tau", "mirostat_tau must be between 0 and 100 (got -1.0)"),
    ({"mirostat": 2, "mirostat_eta": 11.0}, "mirostat_eta", "mirostat_eta must be between 0 and 10 (got 11.0)"),
])
def test_mirostat_out_of_range_is_a_400_naming_its_field(fields, param, fragment):
    engine = FakeEngine()
    with serving_engine(engine) as url:
        status, message = post_refused(f"{url}/completion", {"prompt": "x", "n_predict": 2, **fields})
    assert status == 400 and fragment in message and engine.calls == []


def test_an_engine_that_keeps_no_forms_refuses_mirostat_before_anything_is_queued():
    engine = FakeDSIEngine()
    with serving_engine(engine) as url:
        status, message = post_refused(f"{url}/completion", {"prompt": "x", "n_predict": 2, "mirostat": 2})
    assert status == 400 and "mirostat under --engine dsi" in message and engine.calls == []
    with pytest.raises(SpecchatError, match="--engine dsi cannot sample by mirostat: serve with specexec"):
        check_kept(Defaults(mirostat=1), FakeDSIEngine())
    check_kept(Defaults(mirostat=1), FakeEngine())


def test_on_tiny_models_a_served_reply_under_mirostat_is_autoregressive_decodings(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    body = {"prompt": "hello there", "n_predict": 24, "temperature": 1.0, "seed": 5, "mirostat": 2,
            "mirostat_tau": 2.0}
    with serving_engine(engine, tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024) as url:
        served = post(f"{url}/completion", body)
        plain = post(f"{url}/completion", {**body, "mirostat": 0, "top_p": 1.0})
    prompt_ids = TINY_TOKENIZER.encode("hello there")
    sampling = SamplingParams(1.0, 0.9, seed=5, mirostat=Mirostat(2, 2.0).start())
    events = AutoregressiveEngine(tiny_target, frozenset()).generate(prompt_ids, 24, sampling)
    assert served["content"] == TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])
    assert served["content"] != plain["content"]  # mirostat changed the reply
