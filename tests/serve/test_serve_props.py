"""llama.cpp's GET /props: the server's context, the sampling a request leaves out, its slots, the
model's chat template and whether it speculates, as llama.cpp's front ends read them."""

import json
from importlib.metadata import version
import urllib.error
import urllib.request

import pytest
from helpers.serve_helpers import make_app, serving

from specchat.serve.schema import Defaults
from specchat.tui.fake import FakeEngine


def get(url: str) -> dict:
    with urllib.request.urlopen(url) as response:
        return json.load(response)


def test_props_are_the_servers_context_defaults_slots_and_template():
    app, _ = make_app([FakeEngine(), FakeEngine()], context=2048,
                      sampling=Defaults(0.3, 0.8, seed=7, top_k=40, typical_p=0.9))
    with serving(app) as url:
        props = get(f"{url}/props")
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 2048 and settings["speculative"] is True
    params = settings["params"]
    assert (params["temperature"], params["top_p"], params["seed"], params["top_k"], params["min_p"]) == (
        0.3, 0.8, 7, 40, 0.0)
    assert params["typical_p"] == 0.9
    assert (params["top_n_sigma"], params["xtc_probability"], params["xtc_threshold"]) == (-1.0, 0.0, 0.1)
    assert (params["dynatemp_range"], params["dynatemp_exponent"]) == (0.0, 1.0)
    assert (params["dry_multiplier"], params["dry_base"], params["dry_allowed_length"],
            params["dry_penalty_last_n"]) == (0.0, 1.75, 2, -1)
    assert (params["repeat_penalty"], params["repeat_last_n"], params["presence_penalty"]) == (1.0, 64, 0.0)

    assert props["total_slots"] == 2 and props["model_path"] == "tiny"
    assert props["chat_template"] == "<role>content</>"  # the model's template, as written
    assert props["build_info"] == f"specchat {version('specchat')}"


def test_props_list_the_servers_penalties():
    app, _ = make_app([FakeEngine()], sampling=Defaults(repeat_penalty=1.1, repeat_last_n=32, frequency_penalty=0.2))
    with serving(app) as url:
        params = get(f"{url}/props")["default_generation_settings"]["params"]
    assert (params["repeat_penalty"], params["repeat_last_n"], params["presence_penalty"],
            params["frequency_penalty"]) == (1.1, 32, 0.0, 0.2)


def test_a_server_without_a_seed_shows_llama_cpps_drawn_seed():
    app, _ = make_app([FakeEngine()])
    with serving(app) as url:
        assert get(f"{url}/props")["default_generation_settings"]["params"]["seed"] == -1


def test_autoregressive_serving_says_it_does_not_speculate():
    engine = FakeEngine()
    engine.name = "autoregressive"
    app, _ = make_app([engine])
    with serving(app) as url:
        assert get(f"{url}/props")["default_generation_settings"]["speculative"] is False


def test_the_key_guards_props():
    app, _ = make_app([FakeEngine()], api_key="secret")
    with serving(app) as url, pytest.raises(urllib.error.HTTPError) as refused:
        get(f"{url}/props")
    assert refused.value.code == 401
