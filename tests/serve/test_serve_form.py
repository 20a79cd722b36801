"""A request's form for its reply (serve/form.py): llama.cpp's `grammar` (GBNF or Lark) and
`json_schema` on its own routes and the OpenAI ones, as llama-server takes them, beside OpenAI's
response_format and forced tools; one form a reply, and what cannot compile is a 400 naming the
field."""

from types import SimpleNamespace

import openai
import pytest
from helpers.serve_helpers import MODEL, RecordingGrammars, client, make_app, post_json, post_refused, serving

from specchat.serve.errors import APIError
from specchat.serve.fim import FimTokens
from specchat.serve.form import Form, form_of
from specchat.tui.fake import FakeEngine

GBNF = 'root ::= "yes" | "no"\n'
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
WEATHER = {"name": "get_weather", "parameters": {"type": "object"}}


FREE = SimpleNamespace(json_schema=None, grammar=None)  # a request without llama.cpp's form fields


def test_each_field_asks_its_form_and_none_asks_free_text():
    assert form_of(FREE) is None
    assert form_of(FREE, {"type": "object"}) == Form("response_format", schema={"type": "object"})
    assert form_of(SimpleNamespace(json_schema=SCHEMA, grammar=None)) == Form("json_schema", schema=SCHEMA)
    assert form_of(SimpleNamespace(json_schema=None, grammar=GBNF)) == Form("grammar", grammar=GBNF)
    assert form_of(FREE, None, [WEATHER]) == Form("tools", calls=[WEATHER])


@pytest.mark.parametrize(("request_", "schema", "forced", "message", "param"), [
    (FREE, {"type": "object"}, [WEATHER], "response_format and a tool_choice that forces a call", "tool_choice"),
    (SimpleNamespace(json_schema=SCHEMA, grammar=GBNF), None, [], "json_schema and grammar", "grammar"),
    (SimpleNamespace(json_schema=None, grammar=GBNF), {"type": "object"}, [], "response_format and grammar",
     "grammar"),
])
def test_two_forms_of_one_reply_are_one_400_line(request_, schema, forced, message, param):
    with pytest.raises(APIError) as refused:
        form_of(request_, schema, forced)
    assert refused.value.status == 400 and refused.value.param == param
    assert refused.value.message == f"{message} ask two forms of one reply: send one"


@pytest.fixture
def served():
    engine, compiler = FakeEngine(), RecordingGrammars()
    app, _ = make_app([engine], grammars=lambda: compiler, fim=FimTokens("<P>", "<S>", "<M>"))
    with serving(app) as url:
        yield engine, compiler, url


def test_llama_cpps_routes_keep_the_reply_to_a_grammar_or_a_json_schema(served):
    engine, compiler, url = served
    post_json(f"{url}/completion", {"prompt": "Is it?", "n_predict": 3, "grammar": GBNF})
    assert compiler.compiled[-1] == ("grammar", GBNF) and engine.calls[-1][2].guide == "guide 1"
    post_json(f"{url}/completion", {"prompt": "{", "n_predict": 3, "json_schema": SCHEMA})
    assert compiler.compiled[-1] == ("schema", SCHEMA) and engine.calls[-1][2].guide == "guide 2"
    post_json(f"{url}/infill", {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 3, "grammar": GBNF})
    assert compiler.compiled[-1] == ("grammar", GBNF) and engine.calls[-1][2].guide == "guide 3"
    post_json(f"{url}/completion", {"prompt": "free", "n_predict": 3})
    assert engine.calls[-1][2].guide is None


def test_the_openai_routes_take_llama_servers_grammar_and_json_schema_too(served):
    engine, compiler, url = served
    client(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "ok?"}],
                                        extra_body={"grammar": GBNF})
    assert compiler.compiled == [("grammar", GBNF)] and engine.calls[-1][2].guide == "guide 1"
    client(url).completions.create(model=MODEL, prompt="{", extra_body={"json_schema": SCHEMA})
    assert compiler.compiled[-1] == ("schema", SCHEMA) and engine.calls[-1][2].guide == "guide 2"


def test_a_grammar_that_cannot_compile_or_a_second_form_is_a_400_before_anything_is_queued(served):
    engine, _, url = served
    assert post_refused(f"{url}/completion", {"prompt": "x", "grammar": "root ::= nowhere\n"}) == (
        400, "the grammar cannot be compiled: Rule 'nowhere' not found")
    assert post_refused(f"{url}/completion", {"prompt": "x", "grammar": GBNF, "json_schema": SCHEMA}) == (
        400, "json_schema and grammar ask two forms of one reply: send one")
    with pytest.raises(openai.BadRequestError) as refused:  # OpenAI's shape names the code and the field
        client(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                            extra_body={"grammar": "root ::= nowhere\n"})
    assert (refused.value.code, refused.value.param) == ("invalid_value", "grammar")
    assert engine.calls == []
