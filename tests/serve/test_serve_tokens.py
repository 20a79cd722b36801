"""llama.cpp's tokenizer routes: /tokenize gives the ids the completion routes would run (special
tokens' names read as those tokens unless parse_special is false; with_pieces gives each token's
text, or its bytes where a character is split across tokens), /detokenize the text back, and
/apply-template the chat prompt the chat route encodes; each refusal one line; the key guards them."""

import pytest
from helpers.cli import train_tokenizer
from helpers.serve_helpers import make_app, post_json, post_refused, serving

from specchat.decoding.token_log import TokenLogprobs
from specchat.serve.reply import logprob_entry
from specchat.serve.tokens import piece
from specchat.tui.fake import FakeEngine

CORPUS = ["hello world <eos>", "naïve café", "déjà vu"] * 20


@pytest.fixture(scope="module")
def byte_level():
    return train_tokenizer(CORPUS)


@pytest.fixture
def served(byte_level):
    engine = FakeEngine()
    app, _ = make_app([engine], tokenizer=byte_level)
    with serving(app) as url:
        yield url, engine


def test_tokenize_gives_the_tokenizers_ids_and_detokenize_the_text_back(served, byte_level):
    url, engine = served
    text = "hello café <eos>"
    ids = post_json(f"{url}/tokenize", {"content": text, "model": "any"})["tokens"]  # SillyTavern names a model
    assert ids == byte_level.encode(text, add_special_tokens=False) and byte_level.eos_token_id in ids
    assert post_json(f"{url}/detokenize", {"tokens": ids}) == {"content": text}
    assert engine.calls == []  # the tokenizer alone answered


def test_parse_special_false_keeps_a_special_tokens_name_as_characters(served, byte_level):
    url, _ = served
    ids = post_json(f"{url}/tokenize", {"content": "hello <eos>", "parse_special": False})["tokens"]
    assert byte_level.eos_token_id not in ids and byte_level.decode(ids) == "hello <eos>"


def test_pieces_are_each_tokens_text_or_its_bytes_where_a_character_is_split(served, byte_level):
    url, _ = served
    text = "café ☃"  # the snowman, unseen in training, is three byte tokens
    pieces = post_json(f"{url}/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == byte_level.encode(text, add_special_tokens=False)
    assert b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                    for p in pieces) == text.encode()
    assert [p["piece"] for p in pieces[-3:]] == [[byte] for byte in "☃".encode()]
    assert all(isinstance(p["piece"], str) for p in pieces[:-3])


def test_openai_logprobs_give_a_split_characters_bytes_not_a_replacement_character(byte_level):
    """The same bytes back OpenAI's `bytes` field (serve/reply.py): a token holding part of a
    character decodes alone to U+FFFD, whose bytes are not the token's."""
    first = byte_level.encode("☃", add_special_tokens=False)[0]
    entry = logprob_entry(byte_level, TokenLogprobs(first, -0.5, ((first, -0.5),)))
    assert entry["bytes"] == entry["top_logprobs"][0]["bytes"] == [0xE2] and entry["token"] == "\ufffd"


def test_a_byte_fallback_token_is_the_byte_it_names():
    class ByteFallback:  # what a SentencePiece tokenizer with byte fallback answers for such a token
        def convert_ids_to_tokens(self, token: int) -> str:
            return "<0xE2>"

    assert piece(ByteFallback(), 7) == [0xE2]


def test_apply_template_gives_the_prompt_the_chat_route_encodes():
    engine = FakeEngine()
    app, _ = make_app([engine])
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with serving(app) as url:
        prompt = post_json(f"{url}/apply-template", {"messages": messages})["prompt"]
        post_json(f"{url}/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 2})
    assert prompt == "<system>be brief</><user>hi</><assistant>"
    assert "".join(map(chr, engine.calls[-1][0])) == prompt  # the chat route's prompt, token for character


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("tool_choice", "declared"), [(None, "<tools>weather</>"), ("auto", "<tools>weather</>"),
                                                      ("none", "")])
def test_apply_template_declares_the_tools_as_the_chat_route_does(tool_choice, declared):
    """The request's tools go where the template declares them, none under tool_choice none: the
    prompt the chat route sends the engine for the same body."""
    engine = FakeEngine()
    app, _ = make_app([engine])
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": tool_choice}
    with serving(app) as url:
        prompt = post_json(f"{url}/apply-template", body)["prompt"]
        post_json(f"{url}/v1/chat/completions", {"model": "tiny", "max_tokens": 2, **body})
    assert prompt == f"{declared}<user>hi</><assistant>"
    assert "".join(map(chr, engine.calls[-1][0])) == prompt


@pytest.mark.parametrize(("route", "body", "fragment"), [
    ("/tokenize", {}, "content is required"),
    ("/tokenize", {"content": 5}, "content: input should be a valid string"),
    ("/detokenize", {"tokens": [10**9]}, "tokens: token id 1000000000 is outside the vocabulary"),
    ("/apply-template", {"messages": []}, "messages"),
    ("/apply-template", {"messages": [{"role": "robot", "content": "x"}]}, "unknown role 'robot'"),
    ("/apply-template", {"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "tools[0]: a tool"),
    ("/apply-template", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
     "the request has no tools"),
])
def test_bad_requests_are_one_line_400s(served, route, body, fragment):
    url, _ = served
    code, message = post_refused(f"{url}{route}", body)
    assert code == 400 and fragment in message and "\n" not in message, message


def test_a_model_without_a_chat_template_refuses_apply_template_in_one_line(served):
    url, _ = served  # the trained tokenizer has no chat template
    code, message = post_refused(f"{url}/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
    assert code == 400 and message.startswith("this model has no chat template")


def test_the_key_guards_the_tokenizer_routes(byte_level):
    app, _ = make_app([FakeEngine()], tokenizer=byte_level, api_key="secret")
    with serving(app) as url:
        code, message = post_refused(f"{url}/tokenize", {"content": "hi"})
    assert code == 401 and "API key" in message


# As Mistral's template: each call with its id, and each result with the id of the call it answers.
CALL_IDS_TEMPLATE = ("{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}[CALL {{ c.id }} "
                     "{{ c.function.name }}]{% endfor %}{% elif m.role == 'tool' %}[RESULT {{ m.tool_call_id }} "
                     "{{ m.content }}]{% else %}[{{ m.role }} {{ m.content }}]{% endif %}{% endfor %}")


def test_a_calls_id_and_the_results_tool_call_id_reach_the_template():
    tokenizer = train_tokenizer(CORPUS)
    tokenizer.chat_template = CALL_IDS_TEMPLATE
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_7", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_7", "content": "sunny"}]
    app, _ = make_app([FakeEngine()], tokenizer=tokenizer)
    with serving(app) as url:
        prompt = post_json(f"{url}/apply-template", {"messages": messages})["prompt"]
    assert prompt == "[user weather?][CALL call_7 weather][RESULT call_7 sunny]"
