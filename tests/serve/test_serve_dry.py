"""llama.cpp's DRY on every route: its fields (and the server's, where left out) reach the engine
as decoding/dry.py's Dry, its breakers as the served tokenizer writes them; bad values are a 400
naming the field."""

import ollama
import pytest
from helpers.serve_helpers import ASCII_TOKENIZER, MODEL, client, post_json, post_refused, serving_engine, user

from specchat.decoding.dry import Dry
from specchat.serve.schema import Defaults
from specchat.tui.fake import FakeEngine

DEFAULT_RESTARTS = ((ord("\n"), ()), (ord(":"), ()), (ord('"'), ()), (ord("*"), ()))  # one word a character here


def dry_of(engine: FakeEngine) -> Dry | None:
    state = engine.calls[-1][2].penalties
    return None if state is None else state.penalties.dry


@pytest.fixture
def fake():
    engine = FakeEngine()
    with serving_engine(engine, tokenizer=ASCII_TOKENIZER) as url:
        yield engine, url


def test_llama_cpps_fields_reach_the_engine_with_its_default_or_the_requests_breakers(fake):
    engine, url = fake
    post_json(f"{url}/completion", {"prompt": "a: b", "n_predict": 2, "dry_multiplier": 0.8})
    assert dry_of(engine) == Dry(0.8, 1.75, 2, -1, DEFAULT_RESTARTS)
    post_json(f"{url}/completion", {"prompt": "x", "n_predict": 2, "dry_multiplier": 1.0, "dry_base": 2.0,
                                    "dry_allowed_length": 3, "dry_penalty_last_n": 64,
                                    "dry_sequence_breakers": ["ab", "\n"]})
    # "ab" is two words here: "a" starts it, "b" follows
    assert dry_of(engine) == Dry(1.0, 2.0, 3, 64, ((ord("a"), (ord("b"),)), (ord("\n"), ())))
    post_json(f"{url}/completion", {"prompt": "x", "n_predict": 2, "dry_multiplier": 0})
    assert engine.calls[-1][2].penalties is None


def test_the_openai_and_ollama_routes_take_them_too(fake):
    engine, url = fake
    client(url).chat.completions.create(model=MODEL, messages=user("hi"), extra_body={"dry_multiplier": 0.5})
    assert dry_of(engine) == Dry(0.5, 1.75, 2, -1, DEFAULT_RESTARTS)
    ollama.Client(host=url, timeout=60).chat(model=MODEL, messages=user("hi"),
                                             options={"dry_multiplier": 0.7, "dry_allowed_length": 4})
    assert dry_of(engine) == Dry(0.7, 1.75, 4, -1, DEFAULT_RESTARTS)


def test_the_servers_dry_is_what_a_request_leaves_out():
    engine = FakeEngine()
    with serving_engine(engine, tokenizer=ASCII_TOKENIZER, sampling=Defaults(dry_multiplier=0.6, dry_base=1.5)) as url:
        client(url).completions.create(model=MODEL, prompt="abc")
        assert dry_of(engine) == Dry(0.6, 1.5, 2, -1, DEFAULT_RESTARTS)
        post_json(f"{url}/completion", {"prompt": "x", "n_predict": 2, "dry_allowed_length": 5})
        assert dry_of(engine) == Dry(0.6, 1.5, 5, -1, DEFAULT_RESTARTS)
        post_json(f"{url}/completion", {"prompt": "x", "n_predict": 2, "dry_multiplier": 0})
        assert engine.calls[-1][2].penalties is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"dry_multiplier": 0.8, "dry_base": 0.5}, "dry_base must be between 1 and 100 (got 0.5)"),
    ({"dry_multiplier": -1}, "dry_multiplier must be between 0 and 100 (got -1.0)"),
    ({"dry_multiplier": 0.8, "dry_penalty_last_n": -2},
     "dry_penalty_last_n must be between -1 and 2147483647 (got -2)"),
    ({"dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", ""]},
     "dry_sequence_breakers: a breaker must not be empty"),
])
def test_a_bad_dry_field_is_a_400_line(fake, fields, message):
    engine, url = fake
    assert post_refused(f"{url}/completion", {"prompt": "x", **fields}) == (400, message)
    assert engine.calls == []
