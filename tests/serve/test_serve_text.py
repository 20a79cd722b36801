"""POST /v1/completions driven by the official `openai` client: a raw prompt (text or token ids)
reaches the engine as the tokenizer encodes it, a `suffix` wraps it in the model's
fill-in-the-middle format, echo, stop strings, streaming and the legacy logprobs shape; over the
tiny random models the text and logprobs are exactly the target's greedy ones, and with echo the
prompt's own logprobs are the target's forward's."""

import json
import logging
import urllib.request
from types import SimpleNamespace

import openai
import pytest
import torch
from helpers.serve_helpers import (MODEL, TINY_TOKENIZER, CharTokenizer, client, make_app, prompt_of, serving,
                                   user)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.token_log import TokenLog
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.fim import FimTokens
from specchat.tui.fake import REPLY, FakeEngine

FIM = FimTokens("<P>", "<S>", "<M>")  # one character a token here: the format is what is checked


@pytest.fixture
def fake():
    engine = FakeEngine()
    app, _ = make_app([engine], fim=FIM)
    with serving(app) as url:
        yield engine, client(url), url


def test_a_raw_prompt_is_sent_as_is_and_16_tokens_come_back_by_default(fake):
    engine, api, _ = fake
    reply = api.completions.create(model=MODEL, prompt="def add(a, b):")
    assert prompt_of(engine) == "def add(a, b):"  # no chat template
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].text == REPLY[:16] and reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len("def add(a, b):"), 16)
    assert reply.model_extra["specchat"]["engine"] == "specexec"


def test_a_streamed_completion_joins_to_the_whole_and_ends_with_usage_and_done(fake):
    _, api, url = fake
    whole = api.completions.create(model=MODEL, prompt="hi", max_tokens=200)
    chunks = list(api.completions.create(model=MODEL, prompt="hi", max_tokens=200, stream=True,
                                         stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text == REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(REPLY)
    assert len({c.id for c in chunks}) == 1 and all(c.object == "text_completion" for c in chunks)
    assert raw_lines(url, {"model": MODEL, "prompt": "hi", "stream": True})[-1] == "data: [DONE]"


def raw_lines(url: str, body: dict) -> list[str]:
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return [line for line in response.read().decode().split("\n") if line]


def test_a_suffix_asks_for_the_middle_in_the_fim_format(fake):
    engine, api, _ = fake
    api.completions.create(model=MODEL, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))")
    assert prompt_of(engine) == "<P>def add(a, b):\n    <S>\n\nprint(add(1, 2))<M>"


@pytest.mark.parametrize("stream", [False, True])
def test_echo_puts_the_prompt_before_the_completion(fake, stream):
    _, api, _ = fake
    reply = api.completions.create(model=MODEL, prompt="pre", suffix="post", echo=True, max_tokens=5, stream=stream)
    text = "".join(c.choices[0].text for c in reply if c.choices) if stream else reply.choices[0].text
    assert text == "pre" + REPLY[:5]  # the prompt as given: the suffix is not echoed


@pytest.mark.parametrize("prompt", [[104, 105], [[104, 105]], ["hi"]])
def test_token_ids_or_a_one_item_list_are_the_prompt(fake, prompt):
    engine, api, _ = fake
    api.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert prompt_of(engine) == "hi"


def test_stop_strings_and_sampling_reach_the_completion(fake):
    engine, api, _ = fake
    reply = api.completions.create(model=MODEL, prompt="x", stop=["`python"], max_tokens=200, temperature=0.3,
                                   top_p=0.5, seed=7)
    assert reply.choices[0].text == REPLY[:REPLY.index("`python")] and reply.choices[0].finish_reason == "stop"
    assert engine.calls[-1][2] == SamplingParams(temperature=0.3, top_p=0.5, seed=7)


def test_a_response_format_guides_the_completion():
    engine, compiled = FakeEngine(), []
    grammar = SimpleNamespace(start=lambda: "guide")
    grammars = SimpleNamespace(json_schema=lambda schema: compiled.append(schema) or grammar)
    app, _ = make_app([engine], grammars=lambda: grammars)
    with serving(app) as url:
        client(url).completions.create(model=MODEL, prompt="{", extra_body={"response_format": {"type": "json_object"}})
    assert compiled == [{"type": "object"}] and engine.calls[-1][2].guide == "guide"


def test_a_model_without_a_chat_template_serves_completions_and_refuses_chats_in_one_line():
    plain = CharTokenizer()
    plain.chat_template = None
    app, _ = make_app([FakeEngine()], tokenizer=plain)
    with serving(app) as url:
        api = client(url)
        assert api.completions.create(model=MODEL, prompt="hi", max_tokens=3).choices[0].text == REPLY[:3]
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(model=MODEL, messages=user("hi"))
    assert refused.value.body["message"] == ("this model has no chat template, so it takes no chat: send its "
                                             "prompts to /v1/completions")


@pytest.mark.parametrize("log_prompts", [False, True])
def test_one_log_line_a_completion_its_prompt_only_when_asked(caplog, log_prompts):
    app, _ = make_app([FakeEngine()], log_prompts=log_prompts, fim=FIM)
    with caplog.at_level(logging.INFO, logger="specchat.serve"), serving(app) as url:
        client(url).completions.create(model=MODEL, prompt="hello", suffix="bye", max_tokens=4)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("POST /v1/completions")]
    assert len(lines) == 1 and lines[0].startswith("POST /v1/completions 200 tokens 17+4 ")
    assert lines[0].endswith(' prompt "hello" suffix "bye"') is log_prompts  # 17: <P>hello<S>bye<M>


# The tiny random models: what the server sends is exactly what the target decodes alone.


def served_and_greedy(tiny_target, tiny_draft, **request) -> tuple[object, list, list[int], TokenLog]:
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        api = client(url)
        whole = api.completions.create(model=MODEL, temperature=0, **request)
        chunks = list(api.completions.create(model=MODEL, temperature=0, stream=True, **request))
    log = TokenLog(request.get("logprobs") or 0)
    events = AutoregressiveEngine(tiny_target, frozenset()).generate(
        TINY_TOKENIZER.encode(request["prompt"]), request["max_tokens"], SamplingParams(0.0, token_log=log))
    return whole, chunks, [t for e in events for t in e.token_ids], log


def test_on_tiny_models_the_completion_is_the_targets_greedy_text(tiny_target, tiny_draft):
    whole, chunks, greedy, _ = served_and_greedy(tiny_target, tiny_draft, prompt="hello there", max_tokens=24)
    assert whole.choices[0].text == "".join(c.choices[0].text for c in chunks) == TINY_TOKENIZER.decode(greedy)
    assert whole.choices[0].finish_reason == "length" and whole.model_extra["specchat"]["gen_rate"] > 1


def test_on_tiny_models_logprobs_are_the_targets_in_the_legacy_shape(tiny_target, tiny_draft):
    whole, chunks, greedy, log = served_and_greedy(tiny_target, tiny_draft, prompt="hello there", max_tokens=12,
                                                   logprobs=3)
    logprobs = whole.choices[0].logprobs
    assert logprobs.tokens == [TINY_TOKENIZER.decode([t]) for t in greedy]
    assert logprobs.token_logprobs == [entry.logprob for entry in log.entries]
    assert logprobs.top_logprobs == [{TINY_TOKENIZER.decode([t]): p for t, p in entry.top} for entry in log.entries]
    assert logprobs.text_offset == list(range(12))  # one character a token
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == logprobs.tokens


def test_on_tiny_models_a_stop_string_inside_a_trees_tokens_cuts_logprobs_and_usage_there(tiny_target, tiny_draft):
    """A tree accepts several tokens an iteration: those past a stop string are not the reply's.
    Logprobs cover the text before the stop, usage the tokens through it, streamed or whole."""
    prompt = TINY_TOKENIZER.encode("hello there")
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    events = [event.token_ids for event in engine.generate(prompt, 24, SamplingParams(0.0))]
    engine.forget()
    greedy = [token for ids in events for token in ids]
    text = TINY_TOKENIZER.decode(greedy)
    ends = [len([t for ids in events[:i + 1] for t in ids]) for i in range(len(events))]  # each event's last token
    # a two-character stop whose last token has tokens after it in its own iteration, met first there
    end = next(end for start, last in zip([0, *ends], ends) for end in range(start + 2, last)
               if text.find(text[end - 2:end]) == end - 2)
    stop = text[end - 2:end]
    log = TokenLog(2)
    list(AutoregressiveEngine(tiny_target, frozenset()).generate(prompt, 24, SamplingParams(0.0, token_log=log)))
    request = {"model": MODEL, "prompt": "hello there", "max_tokens": 24, "temperature": 0, "stop": [stop],
               "logprobs": 2}
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        api = client(url)
        whole = api.completions.create(**request)
        chunks = list(api.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    kept = end - 2
    assert whole.choices[0].text == text[:kept] and whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].logprobs.token_logprobs == [entry.logprob for entry in log.entries[:kept]]
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens == end
    streamed = [p for c in chunks if c.choices and c.choices[0].logprobs for p in c.choices[0].logprobs.token_logprobs]
    assert streamed == whole.choices[0].logprobs.token_logprobs


def test_on_tiny_models_echo_with_logprobs_scores_the_prompt_then_the_completion(tiny_target, tiny_draft):
    """lm-evaluation-harness's loglikelihood request (echo, logprobs, temperature 0): the prompt's
    tokens first, the first with no logprob, each other with the target's log-probability after the
    ones before it (transformers' forward of the whole prompt), then the completion's entries;
    streamed, the echoed prompt's chunk carries its entries."""
    whole, chunks, greedy, log = served_and_greedy(tiny_target, tiny_draft, prompt="hello there", max_tokens=4,
                                                   logprobs=2, echo=True)
    ids = TINY_TOKENIZER.encode("hello there")
    with torch.inference_mode():  # float32 logits, as the LM head gives every pass's (decoding/forward.py)
        expected = torch.log_softmax(tiny_target.model(torch.tensor([ids])).logits[0].float().double(), dim=-1)
    tops = [torch.topk(row, 2) for row in expected[:-1]]
    logprobs, size = whole.choices[0].logprobs, len(ids)
    assert whole.choices[0].text == "hello there" + TINY_TOKENIZER.decode(greedy)
    assert logprobs.tokens == [TINY_TOKENIZER.decode([t]) for t in ids + greedy]
    assert logprobs.token_logprobs[:size] == [None] + [expected[i, ids[i + 1]].item() for i in range(size - 1)]
    assert logprobs.top_logprobs[:size] == [None] + [
        {TINY_TOKENIZER.decode([t]): p for t, p in zip(top.indices.tolist(), top.values.tolist())} for top in tops]
    assert logprobs.token_logprobs[size:] == [entry.logprob for entry in log.entries]
    assert logprobs.text_offset == list(range(size + 4))  # one character a token, from the prompt's start
    echoed = chunks[0].choices[0]
    assert echoed.text == "hello there" and echoed.logprobs.token_logprobs == logprobs.token_logprobs[:size]


def test_a_greedy_continuation_scores_as_its_positions_likeliest(tiny_target, tiny_draft):
    """What the harness checks of a continuation it calls greedy: at each of its tokens the logprob
    is the top alternative's; a token the target would not pick is not."""
    _, _, greedy, _ = served_and_greedy(tiny_target, tiny_draft, prompt="hello there", max_tokens=6)
    other = (greedy[2] + 1) % 50
    engine = AutoregressiveEngine(tiny_target, frozenset())
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with serving(app) as url:
        scored = [client(url).completions.create(model=MODEL, prompt=TINY_TOKENIZER.encode("hello there") + tokens,
                                                 max_tokens=1, temperature=0, logprobs=1, echo=True)
                  for tokens in (greedy, greedy[:2] + [other])]
    size = len("hello there")
    for reply, kept in zip(scored, (6, 2)):
        entries = reply.choices[0].logprobs
        picks = [lp == max(top.values()) for lp, top in zip(entries.token_logprobs[size:-1],
                                                            entries.top_logprobs[size:-1])]
        assert picks == [True] * kept + [False] * (len(picks) - kept)


BATCH = ["hello there", "good day", "see you"]


def greedy_text_of(target, prompt: str, tokens: int) -> str:
    events = AutoregressiveEngine(target, frozenset()).generate(TINY_TOKENIZER.encode(prompt), tokens,
                                                                SamplingParams(0.0))
    return TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])


def test_on_tiny_models_a_batch_of_prompts_is_a_choice_each_in_order(tiny_target, tiny_draft, caplog):
    """Whole, a choice each with its own figures and the usage summed;
    streamed, each choice's chunks in turn, joined to the whole, then the summed usage."""
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    with caplog.at_level(logging.INFO, logger="specchat.serve"), serving(app) as url:
        api = client(url)
        whole = api.completions.create(model=MODEL, prompt=BATCH, max_tokens=6, temperature=0)
        chunks = list(api.completions.create(model=MODEL, prompt=BATCH, max_tokens=6, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.text for c in whole.choices] == [greedy_text_of(tiny_target, prompt, 6) for prompt in BATCH]
    prompt_tokens = sum(len(prompt) for prompt in BATCH)  # a character a token
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt_tokens, 18)
    figures = whole.model_extra["specchat"]
    assert len(figures) == 3 and all(figure["engine"] == "specexec" for figure in figures)
    indexes = [c.choices[0].index for c in chunks if c.choices]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1, 2}  # a choice after another
    assert ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)] == \
        [c.text for c in whole.choices]
    assert chunks[-1].usage.completion_tokens == 18 and chunks[-1].usage.prompt_tokens == prompt_tokens
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("POST /v1/completions")]
    assert [line.split()[4] for line in logged] == [f"{prompt_tokens}+18"] * 2


def test_on_tiny_models_a_batch_with_echo_and_logprobs_scores_each_prompt(tiny_target, tiny_draft):
    """lm-evaluation-harness's loglikelihood requests at a batch size above one: token ids, each
    choice scored as its prompt alone is."""
    engine = AutoregressiveEngine(tiny_target, frozenset())
    app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    prompts = [TINY_TOKENIZER.encode(prompt) for prompt in BATCH]
    with serving(app) as url:
        batch = client(url).completions.create(model=MODEL, prompt=prompts, max_tokens=1, temperature=0, logprobs=1,
                                               echo=True)
        alone = [client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=1,
                                                echo=True).choices[0] for prompt in prompts]
    assert [c.logprobs.token_logprobs for c in batch.choices] == [c.logprobs.token_logprobs for c in alone]
    assert [c.logprobs.tokens[:-1] for c in batch.choices] == [list(TINY_TOKENIZER.decode(ids)) for ids in prompts]
    assert all(c.logprobs.token_logprobs[0] is None for c in batch.choices)


def test_on_tiny_models_an_echoed_prompt_runs_through_the_target_once(tiny_target, tiny_draft):
    """Two slots, a conversation in one: the echoed prompt is scored on the other (the one a reply to
    it would take), whose caches then hold it, so its reply computes only the prompt's last token
    again and is the target's greedy text; the conversation's slot is left to its next turn."""
    engines = [TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
               for _ in range(2)]
    app, scheduler = make_app(engines, tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
    first = user("good day")
    with serving(app) as url:
        api = client(url)
        reply = api.chat.completions.create(model=MODEL, messages=first, max_tokens=8, temperature=0)
        held = [list(slot.sequence) for slot in scheduler.slots]
        echoed = api.completions.create(model=MODEL, prompt="hello there", max_tokens=6, temperature=0, logprobs=1,
                                        echo=True)
        second = [*first, {"role": "assistant", "content": reply.choices[0].message.content}, *user("more")]
        again = api.chat.completions.create(model=MODEL, messages=second, max_tokens=4, temperature=0)
    size = len("hello there")
    assert echoed.usage.prompt_tokens_details.cached_tokens == size - 1
    assert echoed.choices[0].text == "hello there" + greedy_text_of(tiny_target, "hello there", 6)
    assert [len(sequence) for sequence in held].count(0) == 1  # the scoring took the empty slot
    assert again.usage.prompt_tokens_details.cached_tokens == reply.usage.prompt_tokens + 8 - 1
