"""POST /infill as llama.cpp's editor plugins send it: the request laid out in the model's
fill-in-the-middle format as llama.cpp lays it (repository context, file chunks, the cursor's
line), llama.cpp's reply objects whole and streamed, the editor stops (indent, time) cutting the
exact reply, and each refusal one line."""

import json

import pytest
from helpers.serve_helpers import (make_app, post_json, post_refused, post_streamed, prompt_of, serving,
                                   serving_engine)

from specchat.serve.fim import FimTokens
from specchat.tui.fake import REPLY, FakeEngine

REPO_FIM = FimTokens("<P>", "<S>", "<M>", "<R>", "<F>")  # one character a token here: the layout is what is checked
BARE_FIM = FimTokens("<P>", "<S>", "<M>")
CURSOR = {"input_prefix": "def f():\n", "prompt": "    ret", "input_suffix": "\nprint(f())\n"}


def post(url: str, body: dict) -> dict:
    return post_json(f"{url}/infill", body)


def refusal(url: str, body: dict) -> tuple[int, str]:
    return post_refused(f"{url}/infill", body)


@pytest.fixture
def fake():
    engine = FakeEngine()
    with serving_engine(engine, fim=REPO_FIM) as url:
        yield engine, url


def test_the_request_is_laid_out_with_the_repository_and_its_files_before_the_cursor(fake):
    engine, url = fake
    post(url, CURSOR | {"n_predict": 4, "input_extra": [{"filename": "a.py", "text": "x = 1\n"}, {"text": "y"}]})
    assert prompt_of(engine) == ("<R>myproject\n<F>a.py\nx = 1\n<F>tmp\ny<F>filename\n"
                                 "<P>def f():\n    ret<S>\nprint(f())\n<M>")


def test_without_repository_tokens_the_chunks_open_as_snippets():
    engine = FakeEngine()
    app, _ = make_app([engine], fim=BARE_FIM)
    with serving(app) as url:
        post(url, CURSOR | {"n_predict": 4, "input_extra": [{"text": "x = 1\n"}]})
    assert prompt_of(engine) == "\n\n--- snippet ---\n\nx = 1\n<P>def f():\n    ret<S>\nprint(f())\n<M>"


def test_the_reply_is_llama_cpps_object_with_the_drafts_in_its_timings(fake):
    engine, url = fake
    reply = post(url, CURSOR | {"n_predict": 12})
    assert reply["content"] == REPLY[:12] and reply["stop"] is True and reply["stop_type"] == "limit"
    assert reply["tokens_predicted"] == 12 and reply["tokens_evaluated"] == len(engine.calls[-1][0])
    assert reply["truncated"] is False and reply["stopping_word"] == "" and reply["model"] == "tiny"
    timings = reply["timings"]
    assert timings["predicted_n"] == 12 and timings["prompt_n"] == reply["tokens_evaluated"]  # nothing was cached
    assert timings["draft_n"] > timings["draft_n_accepted"] > 0


def test_response_fields_pick_paths_out_of_the_reply(fake):
    _, url = fake
    reply = post(url, CURSOR | {"n_predict": 3, "response_fields": ["content", "timings/predicted_n", "nowhere/x"]})
    assert reply == {"content": REPLY[:3], "timings/predicted_n": 3}


def test_a_stop_string_and_the_models_end_say_how_the_reply_stopped(fake):
    engine, url = fake
    engine.reply = "return 1\n\nmore."
    reply = post(url, CURSOR | {"stop": ["\n\n"]})
    assert (reply["content"], reply["stop_type"], reply["stopping_word"]) == ("return 1", "word", "\n\n")
    assert post(url, CURSOR)["stop_type"] == "eos"  # the '.' ends the fake's replies (make_app's stop id)


def test_any_number_of_stop_strings_is_taken_as_llama_cpp_takes_them(fake):
    """llama.cpp's own routes take any number, as OpenAI's do (test_serve_openai's editors' stops)."""
    engine, url = fake
    engine.reply = "return 1\n\nmore."
    reply = post(url, CURSOR | {"stop": ["#", "@", "%", "&", "$", "\n\n"]})
    assert (reply["content"], reply["stopping_word"]) == ("return 1", "\n\n")


def test_a_line_indented_less_than_n_indent_ends_the_reply_before_it(fake):
    engine, url = fake
    engine.reply = "return 1\n    x = 2\n  y = 3\nz."
    reply = post(url, CURSOR | {"n_indent": 4})
    assert reply["content"] == "return 1\n    x = 2\n  " and reply["stop_type"] == "limit"
    # decoded through the "y" that decided the cut (the engine's iteration ran to 25): a token a character
    assert reply["tokens_predicted"] == reply["timings"]["predicted_n"] == len(reply["content"]) + 1


def test_a_streamed_reply_is_llama_cpps_partials_then_the_final_object_without_done(fake):
    _, url = fake
    whole = post(url, CURSOR | {"n_predict": 20})["content"]
    lines = post_streamed(f"{url}/infill", CURSOR | {"n_predict": 20})
    assert all(line.startswith("data: {") for line in lines)  # no [DONE]: llama.cpp's own stream
    objects = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert [o["stop"] for o in objects] == [False] * (len(objects) - 1) + [True]
    assert "".join(o["content"] for o in objects) == whole and objects[-1]["tokens_predicted"] == 20


@pytest.mark.parametrize(("body", "fragment"), [
    ({"input_prefix": "a"}, "input_suffix"),
    (CURSOR | {"input_extra": [{"filename": "a.py"}]}, "input_extra"),
    (CURSOR | {"n_predict": 10**6}, "n_predict"),
    (CURSOR | {"temperature": 9}, "temperature"),
    (CURSOR | {"response_fields": "content"}, "response_fields must be a list of strings"),
])
def test_bad_requests_are_one_line_400s(fake, body, fragment):
    _, url = fake
    code, message = refusal(url, body)
    assert code == 400 and fragment in message and "\n" not in message


def test_a_model_without_fim_tokens_refuses_infill_in_one_line():
    app, _ = make_app([FakeEngine()])
    with serving(app) as url:
        code, message = refusal(url, CURSOR)
    assert code == 400 and message.startswith("/infill: this model has no fill-in-the-middle tokens")
