"""OpenAI's predicted outputs on /v1/chat/completions, through the official `openai` client, on
tiny models: the reply is the one decoded without the prediction (SpecExec scores the predicted
tokens as a chain, the target decides each token), in fewer iterations where it repeats it; the
usage says how many predicted tokens the reply followed and how many it did not; a prediction of
another type is one line. A chat request on any route that predicts nothing gets the code its last
message quotes as the prediction, which its usage does not report."""

import pytest
from helpers.serve_helpers import (MODEL, TINY_TOKENIZER, client, make_app, post_json, post_refused, serving,
                                   serving_recorded, user)

from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine

QUOTING = "make it two:\n```python\nx = 1\n```\nthanks"
QUOTED = "```python\nx = 1\n```"  # the block as a reply holds it (quoted_code.py)
REQUEST = {"model": MODEL, "messages": user("hello there"), "max_tokens": 24, "temperature": 1.0, "top_p": 0.95,
           "seed": 3}


def test_a_predicted_reply_is_the_same_reply_in_fewer_iterations(tiny_target, tiny_draft):
    app, _ = make_app([TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=8))],
                      tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        api = client(url)
        plain = api.chat.completions.create(**REQUEST)
        text = plain.choices[0].message.content
        predicted = api.chat.completions.create(**REQUEST, prediction={"type": "content", "content": text})
        parts = api.chat.completions.create(**REQUEST, prediction={"type": "content", "content": [
            {"type": "text", "text": text[:10]}, {"type": "text", "text": text[10:]}]})
        wrong = api.chat.completions.create(**REQUEST, prediction={"type": "content", "content": "zzzz " * 8})
    assert predicted.choices[0].message.content == parts.choices[0].message.content == text
    assert wrong.choices[0].message.content == text
    size = len(TINY_TOKENIZER.encode(text, add_special_tokens=False))
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == size and details.rejected_prediction_tokens == 0
    assert plain.usage.completion_tokens_details is None  # no prediction, no details
    assert wrong.usage.completion_tokens_details.accepted_prediction_tokens == 0
    # the prompt's pass, then chains of up to 8 (the tiny draft alone: under 2 tokens a tree)
    assert predicted.model_extra["specchat"]["iterations"] <= 4 < plain.model_extra["specchat"]["iterations"]


def test_each_choice_follows_the_prediction_on_its_own_and_the_usage_adds_them(tiny_target, tiny_draft):
    app, _ = make_app([TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=8))],
                      tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        api = client(url)
        first = api.chat.completions.create(**REQUEST).choices[0].message.content
        both = api.chat.completions.create(**REQUEST, n=2, prediction={"type": "content", "content": first})
    assert both.choices[0].message.content == first != both.choices[1].message.content  # seeds 3 and 4
    size = len(TINY_TOKENIZER.encode(first, add_special_tokens=False))
    details = both.usage.completion_tokens_details
    assert size <= details.accepted_prediction_tokens < 2 * size
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == 2 * size


@pytest.mark.parametrize(("prediction", "refusal"), [
    ({"type": "text", "content": "x"}, "prediction.type must be 'content' (got 'text')"),
    ({"type": "content"}, "prediction.content is required"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     "images, audio and files are not supported by specchat"),
])
def test_a_prediction_that_is_not_text_is_one_line(prediction, refusal):
    with serving_recorded() as (engine, _, url):
        status, message = post_refused(f"{url}/v1/chat/completions", {**REQUEST, "prediction": prediction})
    assert (status, message) == (400, refusal) and engine.calls == []


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions", {"messages": user(QUOTING)}),
    ("/v1/messages", {"messages": user(QUOTING), "max_tokens": 16}),
    ("/v1/responses", {"input": QUOTING}),
    ("/api/chat", {"messages": user(QUOTING), "stream": False}),
])
def test_every_chat_route_predicts_the_code_the_last_message_quotes(route, body):
    with serving_recorded() as (engine, _, url):
        answer = post_json(f"{url}{route}", {"model": MODEL, **body})
    prediction = engine.calls[-1][2].prediction
    assert prediction.tokens == tuple(map(ord, QUOTED))  # CharTokenizer: a character a token
    assert prediction.at is None  # followed only once the reply reaches it: an explanation need not
    assert "completion_tokens_details" not in answer.get("usage", {})  # the client predicted nothing


@pytest.mark.parametrize("messages", [
    user("no code here"),
    [*user(QUOTING), {"role": "assistant", "content": "Sure:"}],  # a prefill, not a request to change code
])
def test_a_request_without_quoted_code_of_the_user_last_predicts_nothing(messages):
    with serving_recorded() as (engine, _, url):
        post_json(f"{url}/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert engine.calls[-1][2].prediction is None


def test_the_client_prediction_is_kept_over_the_quoted_code():
    with serving_recorded() as (engine, _, url):
        answer = post_json(f"{url}/v1/chat/completions", {"model": MODEL, "messages": user(QUOTING),
                                                          "prediction": {"type": "content", "content": "y = 2"}})
    assert engine.calls[-1][2].prediction.tokens == tuple(map(ord, "y = 2"))
    assert answer["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] >= 0
