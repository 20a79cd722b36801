"""Several choices for one request (OpenAI's `n`) on /v1/chat/completions and /v1/completions,
driven by the official `openai` client: choice i is decoded with the request's seed + i, so each
repeats exactly as a request of its own with that seed, and the speculative engine's choices are
the target's own seeded autoregressive samples; the prompt is counted once in the usage; streamed,
each choice's chunks come in turn under its index; a batch of prompts orders choice p x n + i;
best_of returns the likeliest n of that many candidates."""

import logging

import pytest
from helpers.serve_helpers import (MODEL, TINY_TOKENIZER, client, make_app, post_json, post_refused, serving,
                                   serving_recorded, user)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.limits import SEED_LIMIT
from specchat.serve.choices import MAX_CHOICES, best_indices, candidate_count, choice_count, choice_sampling
from specchat.serve.errors import APIError

SEED = 7


def tree_engine(tiny_target, tiny_draft) -> TreeEngine:
    return TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))


def sampled(target, prompt_ids: list[int], tokens: int, seed: int) -> str:
    """The target's own seeded sample at t=1 (autoregressive decoding)."""
    events = AutoregressiveEngine(target, frozenset()).generate(prompt_ids, tokens,
                                                                SamplingParams(1.0, 0.95, seed=seed))
    return TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])


def test_a_left_out_n_is_one_choice_and_n_outside_1_to_128_is_refused():
    assert choice_count(None) == 1 and choice_count(MAX_CHOICES) == MAX_CHOICES
    for n in (0, MAX_CHOICES + 1):
        with pytest.raises(APIError, match=f"n must be between 1 and {MAX_CHOICES} \\(got {n}\\)"):
            choice_count(n)


def test_choice_i_draws_from_the_seed_plus_i_wrapping_below_the_limit():
    assert [choice_sampling(SamplingParams(seed=SEED), i).seed for i in range(3)] == [7, 8, 9]
    assert choice_sampling(SamplingParams(seed=SEED_LIMIT - 1), 2).seed == 1


def test_on_tiny_models_each_chat_choice_is_the_targets_sample_at_its_seed(tiny_target, tiny_draft, caplog):
    """Whole and streamed: three choices, each SpecExec's reply = the target's autoregressive sample
    at seed 7 + i = a request of its own at that seed; the prompt counted once, the completions summed."""
    app, _ = make_app([tree_engine(tiny_target, tiny_draft)], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(),
                      context=1024)
    prompt_ids = TINY_TOKENIZER.apply_chat_template(user("hello there"), True, True, True)["input_ids"]
    request = {"model": MODEL, "messages": user("hello there"), "max_tokens": 10, "temperature": 1.0, "top_p": 0.95}
    with caplog.at_level(logging.INFO, logger="specchat.serve"), serving(app) as url:
        api = client(url)
        whole = api.chat.completions.create(**request, seed=SEED, n=3)
        chunks = list(api.chat.completions.create(**request, seed=SEED, n=3, stream=True,
                                                  stream_options={"include_usage": True}))
        alone = [api.chat.completions.create(**request, seed=SEED + i).choices[0].message.content for i in range(3)]
    expected = [sampled(tiny_target, prompt_ids, 10, SEED + i) for i in range(3)]
    assert [c.message.content for c in whole.choices] == alone == expected and len(set(expected)) > 1
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [figure["seed"] for figure in whole.model_extra["specchat"]] == [7, 8, 9]
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(prompt_ids), 30)
    indexes = [c.choices[0].index for c in chunks if c.choices]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1, 2}  # a choice after another
    assert [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role] == ["assistant"] * 3
    assert ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
            for i in range(3)] == expected
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (len(prompt_ids), 30)
    logged = [r.getMessage().split()[4] for r in caplog.records if r.getMessage().startswith("POST /v1/chat")]
    assert logged[:2] == [f"{len(prompt_ids)}+30"] * 2


def test_on_tiny_models_a_batch_of_prompts_with_n_orders_prompt_then_choice(tiny_target, tiny_draft):
    """Two prompts x two choices: choice p x 2 + i is prompt p at seed 7 + i; each prompt counted once."""
    app, _ = make_app([tree_engine(tiny_target, tiny_draft)], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(),
                      context=1024)
    prompts = ["hello there", "good day"]
    with serving(app) as url:
        reply = client(url).completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=8, temperature=1.0,
                                               top_p=0.95, seed=SEED)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert [c.text for c in reply.choices] == [sampled(tiny_target, TINY_TOKENIZER.encode(prompt), 8, SEED + i)
                                               for prompt in prompts for i in range(2)]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (sum(map(len, prompts)), 32)


def test_on_tiny_models_an_echoed_prompt_is_scored_once_for_all_its_choices(tiny_target, tiny_draft):
    engine = AutoregressiveEngine(tiny_target, frozenset())
    scored = []
    score = engine.score
    engine.score = lambda ids, top: scored.append(ids) or score(ids, top)
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        reply = client(url).completions.create(model=MODEL, prompt="hello there", n=3, max_tokens=2, temperature=0,
                                               logprobs=1, echo=True)
    size = len("hello there")
    assert scored == [TINY_TOKENIZER.encode("hello there")]
    assert len({tuple(c.logprobs.token_logprobs) for c in reply.choices}) == 1  # greedy: the same three
    assert all(c.logprobs.token_logprobs[0] is None and len(c.logprobs.tokens) == size + 2 for c in reply.choices)


def test_a_grammar_is_compiled_once_and_each_choice_keeps_it_with_its_own_state():
    with serving_recorded() as (engine, compiler, url):
        client(url).chat.completions.create(model=MODEL, messages=user("hi"), n=3,
                                            response_format={"type": "json_object"})
    assert len(compiler.compiled) == 1
    assert [call[2].guide for call in engine.calls] == ["guide 1"] * 3


# the routes that answer one choice, each with a body it takes
ONE_CHOICE_ROUTES = [
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"messages": user("hi"), "max_tokens": 4}),
    ("/completion", {"prompt": "hi"}),
]


@pytest.mark.parametrize("route, body", ONE_CHOICE_ROUTES)
def test_routes_without_choices_refuse_n_above_one_in_one_line(route, body):
    with serving_recorded() as (_, _, url):
        status, message = post_refused(f"{url}{route}", {"model": MODEL, "n": 2} | body)
    assert (status, message) == (400, "n = 2: several choices (n > 1) on this route are not supported by specchat")


@pytest.mark.parametrize("route, body", ONE_CHOICE_ROUTES)
def test_routes_without_choices_take_n_of_one_and_refuse_n_below_it_as_the_choice_routes_do(route, body):
    with serving_recorded() as (engine, _, url):
        post_json(f"{url}{route}", {"model": MODEL, "n": 1} | body)
        assert len(engine.calls) == 1  # decoded once, as without n
        status, message = post_refused(f"{url}{route}", {"model": MODEL, "n": 0} | body)
    assert (status, message) == (400, f"n must be between 1 and {MAX_CHOICES} (got 0)")


def test_best_of_is_n_where_left_out_and_refused_below_n_or_above_128():
    assert candidate_count(None, 3) == 3 and candidate_count(5, 3) == 5 and candidate_count(MAX_CHOICES, 1) == 128
    for best_of, n in ((1, 2), (MAX_CHOICES + 1, 1)):
        refusal = f"best_of must be between n \\({n}\\) and {MAX_CHOICES} \\(got {best_of}\\)"
        with pytest.raises(APIError, match=refusal):
            candidate_count(best_of, n)


def test_the_best_are_the_highest_scores_highest_first_of_equals_the_earlier():
    assert best_indices([-1.0, -0.5, -2.0, -0.5], 3) == [1, 3, 0]
    assert best_indices([-1.0, -0.5], 2) == [1, 0]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_on_tiny_models_best_of_returns_the_likeliest_candidates_per_token_best_first(tiny_target, tiny_draft):
    """best_of 4, n 2 over two prompts: each prompt's choices are the two of its four seeded
    candidates (the reply n = 4 gives, as SpecExec decodes them) with the highest mean logprob, the
    best first; every candidate's tokens are billed; logprobs are shown only where asked."""
    app, _ = make_app([tree_engine(tiny_target, tiny_draft)], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(),
                      context=1024)
    prompts = ["hello there", "good day"]
    request = {"model": MODEL, "prompt": prompts, "max_tokens": 8, "temperature": 1.0, "top_p": 0.95, "seed": SEED}
    with serving(app) as url:
        api = client(url)
        every = api.completions.create(**request, n=4, logprobs=0)
        best = api.completions.create(**request, n=2, best_of=4)
        shown = api.completions.create(**request, n=2, best_of=4, logprobs=1)
    candidates = [every.choices[start:start + 4] for start in (0, 4)]
    ranked = [sorted(own, key=lambda c: -mean(c.logprobs.token_logprobs))[:2] for own in candidates]
    assert [c.index for own in ranked for c in own] != [0, 1, 4, 5]  # the seed makes the ranking matter
    assert [c.text for c in best.choices] == [c.text for own in ranked for c in own]
    assert [c.index for c in best.choices] == [0, 1, 2, 3] and all(c.logprobs is None for c in best.choices)
    assert [figure["seed"] for figure in best.model_extra["specchat"]] == [SEED + c.index % 4 for own in ranked
                                                                          for c in own]
    assert (best.usage.prompt_tokens, best.usage.completion_tokens) == (sum(map(len, prompts)), 64)
    assert [c.logprobs.token_logprobs for c in shown.choices] == [c.logprobs.token_logprobs for own in ranked
                                                                  for c in own]
