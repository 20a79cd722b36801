"""POST /completion, llama.cpp's own completion route: a raw prompt (text or token ids) reaches
the engine as /v1/completions encodes it, the reply is llama.cpp's object whole or streamed, and
over the tiny random models its text is exactly the target's greedy text."""

import json

import pytest
import torch
from helpers.serve_helpers import TINY_TOKENIZER, make_app, post_json, post_refused, post_streamed, serving

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.tui.fake import REPLY, FakeEngine


@pytest.fixture
def fake():
    engine = FakeEngine()
    app, _ = make_app([engine])
    with serving(app) as url:
        yield engine, f"{url}/completion"


@pytest.mark.parametrize("prompt", ["def add(a, b):", [100, 101, 102]])
def test_the_prompt_reaches_the_engine_as_given_and_the_reply_is_llama_cpps(fake, prompt):
    engine, url = fake
    reply = post_json(url, {"prompt": prompt, "n_predict": 7})
    sent = [ord(char) for char in prompt] if isinstance(prompt, str) else prompt
    assert engine.calls[-1][:2] == (sent, 7)
    assert (reply["content"], reply["stop"], reply["stop_type"], reply["tokens_predicted"]) == (REPLY[:7], True,
                                                                                                 "limit", 7)
    assert reply["tokens_evaluated"] == len(sent) and reply["timings"]["draft_n_accepted"] > 0


def test_llama_cpps_top_k_min_p_typical_p_top_n_sigma_xtc_and_dynatemp_reach_the_engine(fake):
    engine, url = fake
    post_json(url, {"prompt": "x", "n_predict": 2, "temperature": 0.8, "top_k": 40, "min_p": 0.05, "typical_p": 0.7,
                    "top_n_sigma": 1.5, "xtc_probability": 0.3, "xtc_threshold": 0.15, "seed": 3,
                    "dynatemp_range": 0.3, "dynatemp_exponent": 0.5})
    sampling = engine.calls[-1][2]
    assert (sampling.temperature, sampling.top_k, sampling.min_p, sampling.typical_p, sampling.seed) == (
        0.8, 40, 0.05, 0.7, 3)
    assert (sampling.top_n_sigma, sampling.xtc_probability, sampling.xtc_threshold) == (1.5, 0.3, 0.15)
    assert (sampling.dynatemp_range, sampling.dynatemp_exponent) == (0.3, 0.5)


def test_a_streamed_completion_joins_to_the_whole(fake):
    _, url = fake
    objects = [json.loads(line.removeprefix("data: ")) for line in post_streamed(url, {"prompt": "hi", "n_predict": 9})]
    assert "".join(o["content"] for o in objects) == REPLY[:9] and objects[-1]["stop"] is True


@pytest.mark.parametrize(("body", "fragment"), [({"n_predict": 4}, "prompt"), ({"prompt": [10**9]}, "vocabulary"),
                                                ({"prompt": "hi", "n_predict": 10**6}, "n_predict"),
                                                ({"prompt": "hi", "n_probs": 101}, "n_probs must be in [0, 100]"),
                                                ({"prompt": "hi", "n_probs": 2, "post_sampling_probs": True},
                                                 "post_sampling_probs")])
def test_bad_requests_are_one_line_400s(fake, body, fragment):
    _, url = fake
    code, message = post_refused(url, body)
    assert code == 400 and fragment in message and "\n" not in message


def test_on_tiny_models_the_text_is_the_targets_greedy_text(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        reply = post_json(f"{url}/completion", {"prompt": "hello there", "n_predict": 24, "temperature": 0})
    events = AutoregressiveEngine(tiny_target, frozenset()).generate(TINY_TOKENIZER.encode("hello there"), 24,
                                                                     SamplingParams(0.0))
    assert reply["content"] == TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])
    assert reply["timings"]["draft_n_accepted"] > 0  # the tree was accepted in part: speculation ran


def test_n_probs_gives_each_tokens_logprob_and_its_likeliest_alternatives(tiny_target, tiny_draft):
    """On the tiny models at temperature 0: one entry a token, the emitted token's id and text,
    the n likeliest alternatives there, likeliest first, the emitted (greedy) token the first of
    them with its log-probability, under the target's own distribution; streamed, the partial
    objects' entries join to the whole reply's."""
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    body = {"prompt": "hello there", "n_predict": 12, "temperature": 0, "n_probs": 3}
    with serving(app) as url:
        whole = post_json(f"{url}/completion", body)
        streamed = [json.loads(line.removeprefix("data: ")) for line in post_streamed(f"{url}/completion", body)]
    entries = whole["completion_probabilities"]
    assert "".join(entry["token"] for entry in entries) == whole["content"] and len(entries) == 12
    for entry in entries:
        top = entry["top_logprobs"]
        assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert (top[0]["id"], top[0]["logprob"]) == (entry["id"], entry["logprob"]) and entry["logprob"] <= 0
    prompt = TINY_TOKENIZER.encode("hello there")
    ids = [entry["id"] for entry in entries]
    logits = tiny_target.logits(tiny_target.hidden(torch.tensor(prompt + ids[:1]), torch.arange(len(prompt) + 1),
                                                   new_cache())[-2:])
    assert entries[0]["logprob"] == pytest.approx(torch.log_softmax(logits[0].double(), -1)[ids[0]].item())
    assert [e for o in streamed for e in o.get("completion_probabilities", [])] == entries
