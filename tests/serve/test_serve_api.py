"""The server driven by the official `openai` client on a free 127.0.0.1 port, streaming and not:
over fake engines (exact text, finish reasons, usage, the `specchat` figures, stop strings, keys,
logs) and over the tiny random models (the text and its logprobs are the target's own greedy ones)."""

import json
import logging
import re
import urllib.request
from time import perf_counter

import openai
import pytest
from helpers.serve_helpers import (MODEL, TINY_TOKENIZER, CharTokenizer, client, make_app, post_streamed, serving,
                                   serving_engine, user)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.token_log import TokenLog
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.scheduler import Scheduler
from specchat.serve.schema import Defaults
from specchat.tui.fake import REPLY, FakeEngine

PROMPT_OVERHEAD = len("<user></><assistant>")


@pytest.fixture
def fake():
    engine = FakeEngine()
    app, scheduler = make_app([engine])
    with serving(app) as url:
        yield engine, client(url), url


def stream_text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_reply_with_usage_finish_reason_and_the_specchat_figures(fake):
    engine, chat, _ = fake
    start = perf_counter()
    reply = chat.chat.completions.create(model=MODEL, messages=user("hi"))
    elapsed = perf_counter() - start
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content == REPLY
    assert reply.choices[0].finish_reason == "stop"  # the reply ends with the stop token "."
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (PROMPT_OVERHEAD + 2, len(REPLY))
    figures = reply.model_extra["specchat"]
    iterations = figures["iterations"]
    assert figures["engine"] == "specexec" and figures["tree_size"] == 16
    assert figures["gen_rate"] == pytest.approx(len(REPLY) / iterations)
    assert figures["accepted_per_iteration"] == pytest.approx(len(REPLY) / iterations - 1)
    assert figures["draft_s"] == pytest.approx(0.004 * iterations)
    assert figures["target_s"] == pytest.approx(0.020 * iterations)
    assert figures["transfer_s"] == 0.0
    # the decode's wall time (tokens over tokens/s) and the queue's wait fit in what the client waited
    assert 0 <= figures["queue_s"] < elapsed and 0 < len(REPLY) / figures["tokens_per_s"] < elapsed


def test_a_streamed_reply_opens_with_the_role_and_ends_with_usage_and_done(fake):
    _, chat, url = fake
    chunks = list(chat.chat.completions.create(model=MODEL, messages=user("hi"), stream=True,
                                               stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert stream_text(chunks) == REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(REPLY)
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    lines = raw_stream(url, {"model": MODEL, "messages": user("hi"), "stream": True})
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def raw_stream(url: str, body: dict) -> list[str]:
    request = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line for line in response.read().decode().split("\n") if line]


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}])
def test_without_include_usage_no_usage_chunk(fake, options):
    _, chat, _ = fake
    chunks = list(chat.chat.completions.create(model=MODEL, messages=user("hi"), stream=True, stream_options=options))
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_the_token_limit_ends_with_length(fake, field):
    engine, chat, _ = fake
    reply = chat.chat.completions.create(model=MODEL, messages=user("hi"), **{field: 7})
    assert reply.choices[0].message.content == REPLY[:7] and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 7 and engine.calls[-1][1] == 7


def test_max_completion_tokens_wins_over_max_tokens(fake):
    engine, chat, _ = fake
    chat.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=3, max_completion_tokens=5)
    assert engine.calls[-1][1] == 5


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_reply_before_them(fake, stream):
    _, chat, _ = fake
    # "`python" spans several engine iterations: the stream holds back what may start a stop string.
    reply = chat.chat.completions.create(model=MODEL, messages=user("hi"), stop=["nothing", "`python"], stream=stream)
    if stream:
        chunks = list(reply)
        text, finish = stream_text(chunks), [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert text == REPLY[:REPLY.index("`python")] and finish == "stop"


# Continue's autocomplete sends a template's stops to any server but OpenAI's own, its Qwen coder
# template 9 of them: OpenAI's cap of 4 refused every one of its requests.
EDITOR_STOPS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "`python"]


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_an_editors_nine_stop_strings_are_taken(fake, route):
    _, api, _ = fake
    if route == "chat":
        reply = api.chat.completions.create(model=MODEL, messages=user("hi"), stop=EDITOR_STOPS)
        text = reply.choices[0].message.content
    else:
        text = api.completions.create(model=MODEL, prompt="x", stop=EDITOR_STOPS, max_tokens=200).choices[0].text
    assert text == REPLY[:REPLY.index("`python")]


def test_null_stream_and_echo_are_false_as_the_openai_client_sends_them(fake):
    _, _, url = fake
    for path, fields in (("chat/completions", {"messages": user("hi"), "stream": None}),
                         ("completions", {"prompt": "x", "max_tokens": 3, "stream": None, "echo": None})):
        request = urllib.request.Request(f"{url}/v1/{path}", json.dumps({"model": MODEL, **fields}).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as response:
            assert response.status == 200 and json.loads(response.read())["object"].endswith("completion")


@pytest.mark.parametrize(("cuts", "top_k", "min_p", "typical_p"), [({"top_k": 20, "min_p": 0.05}, 20, 0.05, 1.0),
                                                                  ({"top_k": -1}, 0, 0.0, 1.0), ({}, 0, 0.0, 1.0),
                                                                  ({"typical_p": 0.9}, 0, 0.0, 0.9)])
def test_top_k_min_p_and_typical_p_reach_the_engine_as_vllm_and_llama_server_take_them(fake, cuts, top_k, min_p,
                                                                                     typical_p):
    """vLLM's extra sampling parameters (the openai client sends them in extra_body); -1 is its "off";
    llama-server's OpenAI routes take typical_p too."""
    engine, chat, _ = fake
    chat.chat.completions.create(model=MODEL, messages=user("hi"), temperature=0.3, top_p=0.5, seed=7, extra_body=cuts)
    assert engine.calls[-1][2] == SamplingParams(temperature=0.3, top_p=0.5, seed=7, top_k=top_k, min_p=min_p,
                                                 typical_p=typical_p)


def test_messages_reach_the_engine_through_the_chat_template(fake):
    engine, chat, _ = fake
    messages = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [{"type": "text", "text": "more"}, {"type": "text", "text": "!"}]}]
    chat.chat.completions.create(model=MODEL, messages=messages, temperature=0.3, top_p=0.5, seed=7)
    prompt, _, sampling = engine.calls[-1]
    expected = "<system>be brief</><user>hi</><assistant>hello</><user>more!</><assistant>"
    assert "".join(map(chr, prompt)) == expected
    assert sampling == SamplingParams(temperature=0.3, top_p=0.5, seed=7)


def test_sampling_left_out_takes_the_servers_defaults():
    engine = FakeEngine()
    app, _ = make_app([engine], sampling=Defaults(temperature=0.0, top_p=0.8, seed=3))
    with serving(app) as url:
        client(url).chat.completions.create(model=MODEL, messages=user("hi"))
    assert engine.calls[-1][2] == SamplingParams(temperature=0.0, top_p=0.8, seed=3)


def test_the_cuts_left_out_take_the_servers_and_a_request_can_turn_them_off():
    """`serve --top-k 40 --min-p 0.05 --typical-p 0.9`, as llama-server's options: the request's own
    win, -1 and 0 included."""
    engine = FakeEngine()
    app, _ = make_app([engine], sampling=Defaults(temperature=0.3, top_p=0.8, seed=3, top_k=40, min_p=0.05,
                                                  typical_p=0.9))
    with serving(app) as url:
        client(url).chat.completions.create(model=MODEL, messages=user("hi"))
        client(url).chat.completions.create(model=MODEL, messages=user("hi"),
                                            extra_body={"top_k": -1, "min_p": 0, "typical_p": 1})
        client(url).chat.completions.create(model=MODEL, messages=user("hi"), extra_body={"top_k": 2})
    assert [(call[2].top_k, call[2].min_p, call[2].typical_p) for call in engine.calls] == [
        (40, 0.05, 0.9), (0, 0.0, 1.0), (2, 0.05, 0.9)]


def test_llama_servers_top_n_sigma_xtc_and_dynatemp_reach_the_engine_the_servers_where_left_out():
    """`serve --top-n-sigma 2 --xtc-probability 0.5 --dynatemp-range 0.4`: a request's own fields
    win, field by field."""
    engine = FakeEngine()
    app, _ = make_app([engine], sampling=Defaults(temperature=0.3, top_p=0.8, seed=3, top_n_sigma=2.0,
                                                  xtc_probability=0.5, dynatemp_range=0.4))
    with serving(app) as url:
        client(url).chat.completions.create(model=MODEL, messages=user("hi"))
        client(url).chat.completions.create(model=MODEL, messages=user("hi"), extra_body={
            "top_n_sigma": -1, "xtc_threshold": 0.2, "dynatemp_range": 0, "dynatemp_exponent": 2})
        client(url).completions.create(model=MODEL, prompt="hi", extra_body={"xtc_probability": 0})
    assert [(call[2].top_n_sigma, call[2].xtc_probability, call[2].xtc_threshold, call[2].dynatemp_range,
             call[2].dynatemp_exponent) for call in engine.calls] == [
        (2.0, 0.5, 0.1, 0.4, 1.0), (-1.0, 0.5, 0.2, 0.0, 2.0), (2.0, 0.0, 0.1, 0.4, 1.0)]


def test_without_a_seed_anywhere_each_request_draws_its_own_and_is_told_it():
    """OpenAI's, vLLM's and Ollama's servers sample afresh each request: the same prompt asked again
    (a chat UI's Regenerate) gives another reply. The seed drawn comes back, to repeat a reply."""
    engine = FakeEngine()
    app, _ = make_app([engine])  # no --seed
    with serving(app) as url:
        replies = [client(url).chat.completions.create(model=MODEL, messages=user("hi")) for _ in range(3)]
    seeds = [call[2].seed for call in engine.calls]
    assert len(set(seeds)) == 3  # a repeat: 3 draws among 2**31 seeds
    assert [reply.model_extra["specchat"]["seed"] for reply in replies] == seeds


def test_the_reply_is_clipped_to_the_room_left_in_the_context():
    engine = FakeEngine()
    app, _ = make_app([engine], context=PROMPT_OVERHEAD + 2 + 10)
    with serving(app) as url:
        reply = client(url).chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=100)
    assert reply.choices[0].message.content == REPLY[:10] and reply.choices[0].finish_reason == "length"


def test_models_health_and_a_single_model(fake):
    _, chat, url = fake
    assert [m.id for m in chat.models.list()] == [MODEL]
    assert chat.models.retrieve(MODEL).owned_by == "specchat"
    assert chat.models.list().data[0].max_model_len == 4096  # the context, as vLLM lists it (oterm reads it)
    with pytest.raises(openai.NotFoundError):
        chat.models.retrieve("gpt-4")
    with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
        assert json.load(response) == {"status": "ok"}


def test_an_api_key_guards_v1_but_not_health():
    app, _ = make_app([FakeEngine()], api_key="sesame")
    with serving(app) as url:
        with pytest.raises(openai.AuthenticationError) as refused:
            client(url, api_key="wrong").chat.completions.create(model=MODEL, messages=user("hi"))
        assert refused.value.code == "invalid_api_key" and refused.value.body["message"].startswith("wrong API key")
        with pytest.raises(openai.AuthenticationError):
            client(url, api_key="wrong").models.list()
        assert client(url, api_key="sesame").chat.completions.create(model=MODEL, messages=user("hi")).choices
        with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
            assert response.status == 200


def request_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "specchat.serve" and r.getMessage().startswith(("GET", "POST"))]


@pytest.mark.parametrize("log_prompts", [False, True])
def test_one_log_line_per_request_prompts_only_when_asked(caplog, log_prompts):
    caplog.set_level(logging.INFO, logger="specchat.serve")
    app, _ = make_app([FakeEngine()], log_prompts=log_prompts)
    with serving(app) as url:
        chat = client(url)
        chat.chat.completions.create(model=MODEL, messages=user("secret plan"), max_tokens=5)
        list(chat.chat.completions.create(model=MODEL, messages=user("secret plan"), max_tokens=4, stream=True))
        with pytest.raises(openai.NotFoundError):
            chat.chat.completions.create(model="other", messages=user("secret plan"))
    lines = request_lines(caplog)
    assert len(lines) == 3
    assert lines[0].startswith(f"POST /v1/chat/completions 200 tokens {PROMPT_OVERHEAD + 11}+5 ")
    assert lines[1].startswith(f"POST /v1/chat/completions 200 tokens {PROMPT_OVERHEAD + 11}+4 ")
    assert lines[2].startswith("POST /v1/chat/completions 404 ")
    assert all(re.match(r"POST /v1/chat/completions \d{3} (tokens \d+\+\d+ )?\d+\.\d{3}s", line) for line in lines)
    assert all(("secret plan" in line) == log_prompts for line in lines[:2])
    assert "secret plan" not in caplog.text or log_prompts


def test_a_stream_carries_text_beyond_ascii_as_utf8_itself():
    """As OpenAI and llama.cpp send it: "é" on the wire, not its \\u escape (a byte-counting client
    or a grep of a captured stream sees the text)."""
    with serving_engine(FakeEngine(reply="café.")) as url:
        lines = post_streamed(f"{url}/v1/chat/completions", {"model": MODEL, "messages": user("hi")})
    assert "".join(lines).count("é") == 1 and "\\u00e9" not in "".join(lines)


class FailingEngine(FakeEngine):
    def generate(self, prompt_ids, max_new_tokens, sampling):
        yield from super().generate(prompt_ids, 3, sampling)
        raise RuntimeError("out of memory")


def test_an_engine_failure_is_one_line_500_and_the_server_goes_on(caplog):
    """The log counts the tokens decoded before the failure, the whole reply's and the stream's alike."""
    caplog.set_level(logging.INFO, logger="specchat.serve")
    engine = FailingEngine()
    app, _ = make_app([engine])
    with serving(app) as url:
        with pytest.raises(openai.InternalServerError) as failed:
            client(url).chat.completions.create(model=MODEL, messages=user("hi"))
        assert failed.value.body["message"] == "decoding failed: RuntimeError: out of memory"
        assert failed.value.status_code == 500
        assert (failed.value.body["type"], failed.value.body["code"]) == ("server_error", "decoding_failed")
        with pytest.raises(openai.APIError, match="decoding failed: RuntimeError: out of memory"):
            list(client(url).chat.completions.create(model=MODEL, messages=user("hi"), stream=True))
        engine.reply = "ok."
        with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
            assert response.status == 200
    whole, streamed = request_lines(caplog)[:2]
    assert whole.startswith(f"POST /v1/chat/completions 500 tokens {PROMPT_OVERHEAD + 2}+3 ")
    assert streamed.startswith(f"POST /v1/chat/completions 200 tokens {PROMPT_OVERHEAD + 2}+3 ")


# The tiny random models: what the server sends is exactly what the engine decodes.


def tiny_engine(tiny_target, tiny_draft):
    return TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))


def tiny_app(tiny_target, tiny_draft):
    """The server over one SpecExec engine of the tiny models."""
    return make_app([tiny_engine(tiny_target, tiny_draft)], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(),
                    context=1024)[0]


def greedy_text(tiny_target, prompt_ids: list[int], max_new_tokens: int) -> str:
    events = AutoregressiveEngine(tiny_target, frozenset()).generate(prompt_ids, max_new_tokens, SamplingParams(0.0))
    return TINY_TOKENIZER.decode([t for e in events for t in e.token_ids])


def test_on_tiny_models_the_served_text_is_the_targets_greedy_text(tiny_target, tiny_draft):
    app = tiny_app(tiny_target, tiny_draft)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello there"}]
    prompt_ids = TINY_TOKENIZER.apply_chat_template(messages, True, True, True)["input_ids"]
    with serving(app) as url:
        chat = client(url)
        whole = chat.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
        streamed = stream_text(chat.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                                            temperature=0, stream=True))
    assert whole.choices[0].message.content == streamed == greedy_text(tiny_target, prompt_ids, 24)
    assert whole.usage.prompt_tokens == len(prompt_ids) and whole.choices[0].finish_reason == "length"
    assert whole.model_extra["specchat"]["gen_rate"] > 1  # the tree engine did accept drafts


def test_on_tiny_models_a_seed_gives_the_same_reply(tiny_target, tiny_draft):
    app = tiny_app(tiny_target, tiny_draft)
    with serving(app) as url:
        chat = client(url)
        replies = [chat.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=16, temperature=1.0,
                                                seed=seed).choices[0].message.content for seed in (5, 5, 6)]
    assert replies[0] == replies[1] != replies[2]


@pytest.mark.parametrize("slots", [1, 2])
def test_a_second_turn_goes_to_the_slot_holding_the_first_with_its_whole_sequence(tiny_target, tiny_draft, slots):
    """The server's half of conversation reuse (the engines' half: tests/serve/test_serve_reuse.py)."""
    app, scheduler = make_app([tiny_engine(tiny_target, tiny_draft) for _ in range(slots)], tokenizer=TINY_TOKENIZER,
                              stop_ids=frozenset(), context=1024)
    first = user("hello there")
    with serving(app) as url:
        chat = client(url)
        answer = chat.chat.completions.create(model=MODEL, messages=first, max_tokens=12, temperature=0)
        text = answer.choices[0].message.content
        holder = next(slot for slot in scheduler.slots if slot.sequence)
        held = list(holder.sequence)
        chat.chat.completions.create(model=MODEL, messages=user("another conversation"), max_tokens=4)
        second = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
        chat.chat.completions.create(model=MODEL, messages=second, max_tokens=4)
    prompt = TINY_TOKENIZER.apply_chat_template(second, True, True, True)["input_ids"]
    assert len(held) == len(TINY_TOKENIZER.apply_chat_template(first, True, True, True)["input_ids"]) + 12
    assert prompt[:len(held)] == held  # the whole first turn, reply included, leads the second prompt
    assert holder.sequence[:len(prompt)] == prompt  # and the second turn ran on the slot that held it


def test_a_conversation_returns_to_the_slot_that_holds_it():
    engines = [FakeEngine(), FakeEngine()]
    scheduler = Scheduler(engines, max_queue=4)
    tokenizer = CharTokenizer()
    first = tokenizer.encode("<user>a</><assistant>")
    scheduler.slots[0].sequence, scheduler.slots[0].last_used = first + tokenizer.encode("reply."), 2
    scheduler.slots[1].sequence, scheduler.slots[1].last_used = tokenizer.encode("<user>b</><assistant>x"), 1
    continued = first + tokenizer.encode("reply.</><user>more</><assistant>")
    assert scheduler.pick(continued) is scheduler.slots[0]
    # A new conversation sharing only "<user>" goes to the least recently used slot.
    assert scheduler.pick(tokenizer.encode("<user>a new one</><assistant>")) is scheduler.slots[1]


def test_a_prompt_continues_a_slot_when_it_shares_more_than_half_of_its_sequence():
    scheduler = Scheduler([FakeEngine(), FakeEngine()], max_queue=4)
    scheduler.slots[0].sequence, scheduler.slots[0].last_used = list(range(1, 11)), 2
    scheduler.slots[1].sequence, scheduler.slots[1].last_used = [50, 51], 1
    assert scheduler.pick([1, 2, 3, 4, 5, 6, 99]) is scheduler.slots[0]  # 6 of its 10 tokens
    assert scheduler.pick([1, 2, 3, 4, 5, 99]) is scheduler.slots[1]  # 5 of 10: the least recently used


@pytest.mark.parametrize("top", [0, 2])
def test_on_tiny_models_chat_logprobs_are_the_targets_each_with_top_logprobs_alternatives(tiny_target, tiny_draft, top):
    app = tiny_app(tiny_target, tiny_draft)
    prompt_ids = TINY_TOKENIZER.apply_chat_template(user("hello there"), True, True, True)["input_ids"]
    with serving(app) as url:
        reply = client(url).chat.completions.create(model=MODEL, messages=user("hello there"), max_tokens=12,
                                                    temperature=0, logprobs=True, top_logprobs=top)
    log = TokenLog(top)
    list(AutoregressiveEngine(tiny_target, frozenset()).generate(prompt_ids, 12, SamplingParams(0.0, token_log=log)))
    entries = reply.choices[0].logprobs.content
    assert [entry.token for entry in entries] == [TINY_TOKENIZER.decode([e.token]) for e in log.entries]
    assert [entry.logprob for entry in entries] == [e.logprob for e in log.entries]
    assert [[(a.token, a.logprob) for a in entry.top_logprobs] for entry in entries] == [
        [(TINY_TOKENIZER.decode([t]), p) for t, p in e.top] for e in log.entries]
    assert all(len(entry.top_logprobs) == top for entry in entries)
