"""The embedding routes over the tiny target, driven by OpenAI's and Ollama's own clients: each
vector is the target's pooled rows (decoding/embedding.py) of the input's tokens, at unit length
(OpenAI's and /api/embed) or as pooled (/api/embeddings), in the inputs' order, texts and token
arrays alike, base64 as the OpenAI client asks by default; `dimensions` cuts and normalizes again;
Ollama's truncate cuts to the context; llama.cpp's /embedding normalizes as embd_normalize asks;
every refusal is one line of each API's shape."""

import base64
import logging

import numpy
import ollama
import openai
import pytest
import torch
from helpers.dsi_turns import dsi
from helpers.serve_helpers import (MODEL, TINY_TOKENIZER, client, make_app, post_json, post_refused, serving,
                                   serving_engine)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.embedding import embedding
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine

TEXTS = [TINY_TOKENIZER.decode(ids) for ids in ([7, 3, 19, 3, 41], [12, 12, 0, 33], [5])]
CONTEXT = 64


@pytest.fixture(scope="module")
def served(tiny_target):
    with serving_engine(AutoregressiveEngine(tiny_target, []), tokenizer=TINY_TOKENIZER, context=CONTEXT) as url:
        yield url


def unit(vector: torch.Tensor) -> list[float]:
    """At length 1, the length summed in float64 as llama.cpp sums it."""
    return (vector / vector.double().norm()).tolist()


def expected(target, text: str, pooling: str = "mean") -> torch.Tensor:
    return embedding(target, TINY_TOKENIZER.encode(text), pooling)


def test_openai_vectors_are_the_pooled_rows_at_unit_length_in_order(served, tiny_target):
    """The client's default asks base64 (float32 bytes, which it decodes); float gives the same numbers."""
    answer = client(served).embeddings.create(model=MODEL, input=TEXTS)
    floats = client(served).embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    wanted = [unit(expected(tiny_target, text)) for text in TEXTS]
    assert [item.embedding for item in answer.data] == [item.embedding for item in floats.data] == wanted
    assert [item.index for item in answer.data] == [0, 1, 2] and answer.model == MODEL
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == 10
    # float32 rounding: 5e-8 off length 1 at most (AMD EPYC, 2026-12-02)
    assert numpy.linalg.norm(answer.data[0].embedding) == pytest.approx(1.0, abs=1e-7)


def test_an_embedding_is_logged_with_its_inputs_tokens_and_none_decoded(tiny_target, caplog):
    caplog.set_level(logging.INFO, logger="specchat.serve")
    engine = AutoregressiveEngine(tiny_target, [])
    with serving_engine(engine, tokenizer=TINY_TOKENIZER, context=CONTEXT) as url:  # read once it stops
        client(url).embeddings.create(model=MODEL, input=TEXTS)
    [line] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("POST")]
    assert line.startswith("POST /v1/embeddings 200 tokens 10+0 ")


def test_token_arrays_embed_as_the_texts_they_encode(served):
    by_text = client(served).embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float")
    by_ids = client(served).embeddings.create(model=MODEL, input=[TINY_TOKENIZER.encode(t) for t in TEXTS[:2]],
                                              encoding_format="float")
    one = client(served).embeddings.create(model=MODEL, input=TINY_TOKENIZER.encode(TEXTS[0]), encoding_format="float")
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in by_text.data]
    assert one.data[0].embedding == by_text.data[0].embedding and len(one.data) == 1


def test_base64_is_the_float32_bytes_of_the_vector(served):
    raw = post_json(f"{served}/v1/embeddings", {"model": MODEL, "input": TEXTS[0], "encoding_format": "base64"})
    floats = post_json(f"{served}/v1/embeddings", {"model": MODEL, "input": TEXTS[0]})  # float: the API's default
    decoded = numpy.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == floats["data"][0]["embedding"]


def test_dimensions_keep_the_first_entries_normalized_again(served, tiny_target):
    answer = client(served).embeddings.create(model=MODEL, input=TEXTS[0], dimensions=3, encoding_format="float")
    assert answer.data[0].embedding == unit(expected(tiny_target, TEXTS[0])[:3])
    ollamas = ollama.Client(host=served).embed(model=MODEL, input=TEXTS[0], dimensions=3)
    assert list(ollamas.embeddings[0]) == answer.data[0].embedding


def test_ollamas_embed_gives_the_same_unit_vectors(served, tiny_target):
    answer = ollama.Client(host=served).embed(model=MODEL, input=TEXTS)
    assert [list(vector) for vector in answer.embeddings] == [unit(expected(tiny_target, text)) for text in TEXTS]
    assert answer.prompt_eval_count == 10 and answer.total_duration > 0
    assert ollama.Client(host=served).embed(model=f"{MODEL}:latest", input=[]).embeddings == []  # a load check


def test_ollamas_older_route_gives_the_pooled_vector_as_it_is(served, tiny_target):
    answer = ollama.Client(host=served).embeddings(model=MODEL, prompt=TEXTS[0])
    assert list(answer.embedding) == expected(tiny_target, TEXTS[0]).tolist()
    assert list(ollama.Client(host=served).embeddings(model=MODEL, prompt="").embedding) == []


def test_ollamas_truncate_cuts_to_the_context_or_refuses(served, tiny_target):
    long = TINY_TOKENIZER.decode([(7 * i) % 50 for i in range(CONTEXT + 9)])
    cut = ollama.Client(host=served).embed(model=MODEL, input=long)
    assert list(cut.embeddings[0]) == unit(expected(tiny_target, long[:CONTEXT])) and cut.prompt_eval_count == CONTEXT
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=served).embed(model=MODEL, input=long, truncate=False)
    assert refused.value.status_code == 400 and "exceeds the context length (64 tokens)" in refused.value.error


@pytest.mark.parametrize("path", ["/embedding", "/embeddings"])
def test_llama_cpps_route_lists_each_vector_normalized_as_asked(served, tiny_target, path):
    """Euclidean by default; -1 none; 0 the largest magnitude to 32760; 1 taxicab; `input` as `content`."""
    raw = [expected(tiny_target, text) for text in TEXTS[:2]]
    answer = post_json(f"{served}{path}", {"content": TEXTS[:2]})
    assert answer == [{"index": index, "embedding": [unit(vector)]} for index, vector in enumerate(raw)]
    as_is = post_json(f"{served}{path}", {"input": TINY_TOKENIZER.encode(TEXTS[0]), "embd_normalize": -1})
    assert as_is == [{"index": 0, "embedding": [raw[0].tolist()]}]
    largest = post_json(f"{served}{path}", {"content": TEXTS[0], "embd_normalize": 0})[0]["embedding"][0]
    # one float32 step there: 0.002 off 32760 at most (AMD EPYC, 2026-12-02)
    assert max(map(abs, largest)) == pytest.approx(32760, abs=0.004)
    taxicab = post_json(f"{served}{path}", {"content": TEXTS[0], "embd_normalize": 1})[0]["embedding"][0]
    # float32 rounding: 1.26e-8 off 1 at most (AMD EPYC, 2026-12-02)
    assert sum(map(abs, taxicab)) == pytest.approx(1.0, abs=2.5e-8)


@pytest.mark.parametrize(("body", "fragment"), [
    ({}, '"input" or "content" must be provided'),
    ({"content": []}, "content is empty"),
    ({"content": ["x", ""]}, "content[1] is empty"),
    ({"content": [3] * (CONTEXT + 1)}, "content[0] is 65 tokens, past the context of 64"),
    ({"content": "x", "embd_normalize": "2"}, "embd_normalize: input should be a valid integer"),
])
def test_llama_cpps_route_refuses_in_one_line(served, body, fragment):
    status, message = post_refused(f"{served}/embedding", body)
    assert status == 400 and fragment in message and "\n" not in message


def test_last_pooling_takes_the_last_row(tiny_target):
    with serving_engine(AutoregressiveEngine(tiny_target, []), tokenizer=TINY_TOKENIZER, pooling="last") as url:
        answer = client(url).embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    assert answer.data[0].embedding == unit(expected(tiny_target, TEXTS[0], "last"))


@pytest.mark.parametrize(("body", "status", "fragment"), [
    ({"model": "other", "input": "x"}, 404, "model 'other' is not served here"),
    ({"model": MODEL, "input": []}, 400, "input is empty"),
    ({"model": MODEL, "input": ""}, 400, "input is empty"),
    ({"model": MODEL, "input": [[1], []]}, 400, "input[1] is empty"),
    ({"model": MODEL, "input": [3, 50]}, 400, "input[0]: token id 50 is outside the vocabulary [0, 50)"),
    ({"model": MODEL, "input": [3] * (CONTEXT + 1)}, 400, "input[0] is 65 tokens, past the context of 64"),
    ({"model": MODEL, "input": "x", "encoding_format": "hex"}, 400, "encoding_format must be one of float, base64"),
    ({"model": MODEL, "input": TEXTS[0], "dimensions": 0}, 400, "dimensions must be in [1, 32] (got 0)"),
    ({"model": MODEL, "input": ["x", 1]}, 400, "input"),
    ({"input": "x"}, 400, "model is required"),
])
def test_openai_refusals_are_one_line(served, body, status, fragment):
    with pytest.raises(openai.APIStatusError) as refused:
        client(served).post("/embeddings", body=body, cast_to=object)
    message = refused.value.body["message"]
    assert refused.value.status_code == status and fragment in message and "\n" not in message


@pytest.mark.parametrize(("call", "status", "fragment"), [
    (lambda c: c.embed(model="other", input="x"), 404, "model 'other' not found"),
    (lambda c: c.embeddings(model="other", prompt="x"), 404, "model 'other' not found"),
    (lambda c: c.embed(model=MODEL, input=["x", ""]), 400, "input[1] is empty"),
])
def test_ollama_refusals_are_ollamas_error_in_one_line(served, call, status, fragment):
    with pytest.raises(ollama.ResponseError) as refused:
        call(ollama.Client(host=served))
    assert refused.value.status_code == status and fragment in refused.value.error


def test_a_served_dsi_engine_refuses_embeddings_in_one_line(tiny_target, tiny_draft):
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=2) as engine, \
            serving_engine(engine, tokenizer=TINY_TOKENIZER) as url:
        with pytest.raises(openai.BadRequestError) as refused:
            client(url).embeddings.create(model=MODEL, input=TEXTS[0])
    assert refused.value.body["message"].startswith("--engine dsi computes no embeddings")


def test_the_key_guards_the_embedding_routes(tiny_target):
    with serving_engine(AutoregressiveEngine(tiny_target, []), tokenizer=TINY_TOKENIZER, api_key="sesame") as url:
        with pytest.raises(openai.AuthenticationError):
            client(url, api_key="wrong").embeddings.create(model=MODEL, input=TEXTS[0])
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=url).embed(model=MODEL, input=TEXTS[0])
        assert refused.value.status_code == 401
        assert client(url, api_key="sesame").embeddings.create(model=MODEL, input=TEXTS[0]).data


def test_an_embedding_between_two_turns_leaves_the_conversations_caches(tiny_target, tiny_draft):
    """Two slots, the embedding run on the first, which holds the conversation, and counted as no
    use of a slot: a new conversation after it takes the other slot, and the second turn goes back
    to the first and reuses everything up to the first reply's last token, with the tokens a fresh
    engine gives."""
    engines = [TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
               for _ in range(2)]
    app, _ = make_app(engines, tokenizer=TINY_TOKENIZER, stop_ids=frozenset())
    first = [{"role": "user", "content": TEXTS[0]}]
    with serving(app) as url:
        chat = client(url)
        reply = chat.chat.completions.create(model=MODEL, messages=first, max_tokens=8, temperature=0)
        chat.embeddings.create(model=MODEL, input=TEXTS[1])
        chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": TEXTS[2]}], max_tokens=8)
        second = [*first, {"role": "assistant", "content": reply.choices[0].message.content},
                  {"role": "user", "content": TEXTS[2]}]
        again = chat.chat.completions.create(model=MODEL, messages=second, max_tokens=8, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == reply.usage.prompt_tokens + 8 - 1
    prompt = TINY_TOKENIZER.apply_chat_template(second, True, True, True)["input_ids"]
    fresh = AutoregressiveEngine(tiny_target, frozenset()).generate(prompt, 8, SamplingParams(0.0))
    assert again.choices[0].message.content == TINY_TOKENIZER.decode([t for e in fresh for t in e.token_ids])


class FailingPass(AutoregressiveEngine):
    def embed(self, token_ids, pooling):
        raise RuntimeError("out of memory")


def test_a_pass_that_fails_is_one_line_500_of_its_own_code(tiny_target):
    with serving_engine(FailingPass(tiny_target, []), tokenizer=TINY_TOKENIZER, context=CONTEXT) as url:
        with pytest.raises(openai.InternalServerError) as failed:
            client(url).embeddings.create(model=MODEL, input=TEXTS[0])
    assert failed.value.status_code == 500
    assert (failed.value.body["message"], failed.value.body["code"]) == (
        "the target's pass failed: RuntimeError: out of memory", "pass_failed")
