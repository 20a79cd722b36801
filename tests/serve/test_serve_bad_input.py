"""Bad input, at the HTTP level and in the body: each case answers its status with one line in
OpenAI's error shape, and the server stays up after each (health and a good request pass),
never logging a traceback."""

import json
import urllib.error
import urllib.request

import pytest
from helpers.serve_helpers import MODEL, CharTokenizer, make_app, serving, serving_engine, user

from specchat.tui.fake import FakeEngine

KEY = "sesame"
GOOD = {"model": MODEL, "messages": user("hi"), "max_tokens": 4}
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def body(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def text(**changes) -> bytes:
    """A text completion's body; a change to None leaves that field out."""
    fields = {"model": MODEL, "prompt": "hi", "max_tokens": 4, **changes}
    return json.dumps({k: v for k, v in fields.items() if v is not None}).encode()


def responses(**changes) -> bytes:
    """A Responses API request's body; a change to None leaves that field out."""
    fields = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **changes}
    return json.dumps({k: v for k, v in fields.items() if v is not None}).encode()


def without(field: str) -> bytes:
    return json.dumps({k: v for k, v in GOOD.items() if k != field}).encode()


# (name, method, path, body, headers, status, code, message)
CASES = [
    ("malformed JSON", "POST", "/v1/chat/completions", b'{"model": "tiny",', AUTH, 400, "invalid_json",
     "the body is not valid JSON: EOF while parsing a value at line 1 column 17"),
    ("empty body", "POST", "/v1/chat/completions", b"", AUTH, 400, "invalid_json",
     "the body is not valid JSON: EOF while parsing a value at line 1 column 0"),
    ("body not an object", "POST", "/v1/chat/completions", b"[1, 2]", AUTH, 400, "invalid_type",
     "the request body must be a JSON object"),
    ("no model", "POST", "/v1/chat/completions", without("model"), AUTH, 400, "missing_field", "model is required"),
    ("no messages", "POST", "/v1/chat/completions", without("messages"), AUTH, 400, "missing_field",
     "messages is required"),
    ("empty messages", "POST", "/v1/chat/completions", body(messages=[]), AUTH, 400, "invalid_type",
     "messages: list should have at least 1 item after validation, not 0"),
    ("messages not a list", "POST", "/v1/chat/completions", body(messages="hi"), AUTH, 400, "invalid_type",
     "messages: input should be a valid array"),
    ("unknown role", "POST", "/v1/chat/completions", body(messages=[{"role": "bot", "content": "hi"}]), AUTH, 400,
     "invalid_value", "messages[0].role: unknown role 'bot': use system, user, assistant or tool"),
    ("content a number", "POST", "/v1/chat/completions", body(messages=[{"role": "user", "content": 3}]), AUTH, 400,
     "invalid_type", "messages[0].content: input should be a valid string"),
    ("content missing", "POST", "/v1/chat/completions", body(messages=[{"role": "user"}]), AUTH, 400,
     "missing_field", "messages[0].content is required"),
    ("max_tokens a string", "POST", "/v1/chat/completions", body(max_tokens="10"), AUTH, 400, "invalid_type",
     "max_tokens: input should be a valid integer"),
    ("max_tokens zero", "POST", "/v1/chat/completions", body(max_tokens=0), AUTH, 400, "invalid_value",
     "max_tokens must be between 1 and 32768 (got 0)"),
    ("max_completion_tokens too many", "POST", "/v1/chat/completions", body(max_completion_tokens=10**6), AUTH,
     400, "invalid_value", "max_completion_tokens must be between 1 and 32768 (got 1000000)"),
    ("temperature out of range", "POST", "/v1/chat/completions", body(temperature=9), AUTH, 400, "invalid_value",
     "temperature must be between 0 and 5 (got 9.0)"),
    ("top_p zero", "POST", "/v1/chat/completions", body(top_p=0), AUTH, 400, "invalid_value",
     "top_p must be in (0, 1] (got 0.0)"),
    ("top_k below -1", "POST", "/v1/chat/completions", body(top_k=-2), AUTH, 400, "invalid_value",
     "top_k must be between -1 and 2147483647 (got -2)"),
    ("min_p above 1", "POST", "/v1/completions", text(min_p=1.5), AUTH, 400, "invalid_value",
     "min_p must be between 0 and 1 (got 1.5)"),
    ("typical_p above 1", "POST", "/v1/chat/completions", body(typical_p=1.5), AUTH, 400, "invalid_value",
     "typical_p must be in (0, 1] (got 1.5)"),
    ("top_n_sigma below -1", "POST", "/v1/completions", text(top_n_sigma=-3), AUTH, 400, "invalid_value",
     "top_n_sigma must be between -1 and 100 (got -3.0)"),
    ("xtc_probability above 1", "POST", "/v1/chat/completions", body(xtc_probability=2), AUTH, 400, "invalid_value",
     "xtc_probability must be between 0 and 1 (got 2.0)"),
    ("negative seed", "POST", "/v1/chat/completions", body(seed=-1), AUTH, 400, "invalid_value",
     "seed must be >= 0 and below 2**63 (got -1)"),
    ("stream not a boolean", "POST", "/v1/chat/completions", body(stream="yes"), AUTH, 400, "invalid_type",
     "stream: input should be a valid boolean"),
    ("empty stop string", "POST", "/v1/chat/completions", body(stop=[""]), AUTH, 400, "invalid_value",
     "stop: a stop string must not be empty"),
    ("n zero", "POST", "/v1/chat/completions", body(n=0), AUTH, 400, "invalid_value",
     "n must be between 1 and 128 (got 0)"),
    ("functions", "POST", "/v1/chat/completions", body(functions=[{"name": "f"}]), AUTH, 400,
     "unsupported_parameter",
     "functions (the API's older form of tools: send tools and tool_choice) is not supported by specchat"),
    ("a tool not a function", "POST", "/v1/chat/completions", body(tools=[{"type": "retrieval"}]), AUTH, 400,
     "invalid_type", 'tools[0]: a tool is {"type": "function", "function": {"name": ...}}'),
    ("tool_choice whose function is not an object", "POST", "/v1/chat/completions",
     body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function",
                                                                                "function": None}),
     AUTH, 400, "invalid_value", 'tool_choice: auto, none, required or {"type": "function", "function": '
     '{"name": N}} naming one of the request\'s tools'),
    ("tool_choice naming no tool", "POST", "/v1/chat/completions",
     body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function",
                                                                                "function": {"name": "g"}}),
     AUTH, 400, "invalid_value", 'tool_choice: auto, none, required or {"type": "function", "function": '
     '{"name": N}} naming one of the request\'s tools'),
    ("forced tools without a grammar", "POST", "/v1/chat/completions",
     body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required"), AUTH, 400,
     "unsupported_parameter", "tools: this server's tokenizer takes no grammar"),
    ("call arguments not JSON", "POST", "/v1/chat/completions", body(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f",
                                                                                          "arguments": "{"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c"}]), AUTH, 400, "invalid_value",
     "messages[1].tool_calls[0].function.arguments is not JSON"),
    ("tool message without its call", "POST", "/v1/chat/completions",
     body(messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]), AUTH, 400,
     "missing_field", "messages[1].tool_call_id is required: the id of the call this message answers"),
    ("unknown response format", "POST", "/v1/chat/completions", body(response_format={"type": "xml"}), AUTH, 400,
     "invalid_value", "response_format.type: 'xml' is not one of text, json_object, json_schema"),
    ("image", "POST", "/v1/chat/completions", body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]), AUTH, 400,
     "unsupported_parameter", "images, audio and files are not supported by specchat"),
    ("a text part's text a number", "POST", "/v1/chat/completions", body(messages=[{"role": "user", "content": [
        {"type": "text", "text": 5}]}]), AUTH, 400, "invalid_type",
     'messages[0].content: a content part must be {"type": "text", "text": "..."}'),
    ("a content part of another type", "POST", "/v1/chat/completions", body(messages=[{"role": "user", "content": [
        {"type": "refusal", "text": "no"}]}]), AUTH, 400, "invalid_type",
     'messages[0].content: a content part must be {"type": "text", "text": "..."}'),
    ("stream_options not an object", "POST", "/v1/chat/completions", body(stream_options="usage"), AUTH, 400,
     "invalid_type", "stream_options: input should be an object"),
    ("top_logprobs without logprobs", "POST", "/v1/chat/completions", body(top_logprobs=2), AUTH, 400,
     "invalid_value", "top_logprobs needs logprobs: true"),
    ("top_logprobs too many", "POST", "/v1/chat/completions", body(logprobs=True, top_logprobs=21), AUTH, 400,
     "invalid_value", "top_logprobs must be in [0, 20] (got 21)"),
    ("prompt over the context", "POST", "/v1/chat/completions", body(messages=user("x" * 300)), AUTH, 400,
     "context_length_exceeded",
     "the prompt is 320 tokens, which leaves no room for a reply in the 256-token context: shorten it"),
    ("no key", "POST", "/v1/chat/completions", body(), {"Content-Type": "application/json"}, 401, "invalid_api_key",
     "missing API key: send the header 'Authorization: Bearer KEY'"),
    ("wrong key", "POST", "/v1/chat/completions", body(), {**AUTH, "Authorization": "Bearer nope"}, 401,
     "invalid_api_key", "wrong API key: send the header 'Authorization: Bearer KEY'"),
    ("unknown model", "POST", "/v1/chat/completions", body(model="gpt-4o"), AUTH, 404, "model_not_found",
     "model 'gpt-4o' is not served here: this server serves 'tiny'"),
    ("unknown path", "POST", "/v1/images/generations", body(), AUTH, 404, "unknown_url",
     "unknown path: POST /v1/images/generations"),
    ("wrong method", "GET", "/v1/chat/completions", None, AUTH, 405, "method_not_allowed",
     "method GET not allowed on /v1/chat/completions"),
    ("text: no prompt", "POST", "/v1/completions", text(prompt=None), AUTH, 400, "missing_field",
     "prompt is required"),
    ("text: a prompt a number", "POST", "/v1/completions", text(prompt=3), AUTH, 400, "invalid_type",
     "prompt: input should be a valid string"),
    ("text: empty prompt", "POST", "/v1/completions", text(prompt=""), AUTH, 400, "invalid_value",
     "the prompt is empty after tokenization"),
    ("text: a batch with an empty prompt", "POST", "/v1/completions", text(prompt=["a", ""]), AUTH, 400,
     "invalid_value", "the prompt is empty after tokenization"),
    ("text: a token id outside the vocabulary", "POST", "/v1/completions", text(prompt=[104, 2_000_000]), AUTH, 400,
     "invalid_value", "prompt: token id 2000000 is outside the vocabulary [0, 1114112)"),
    ("text: a suffix the model cannot fill before", "POST", "/v1/completions", text(suffix="}"), AUTH, 400,
     "unsupported_parameter", "suffix: this model has no fill-in-the-middle tokens, so it cannot complete before "
     "a suffix"),
    ("text: best_of below n", "POST", "/v1/completions", text(best_of=1, n=2), AUTH, 400, "invalid_value",
     "best_of must be between n (2) and 128 (got 1)"),
    ("text: best_of 129", "POST", "/v1/completions", text(best_of=129), AUTH, 400, "invalid_value",
     "best_of must be between n (1) and 128 (got 129)"),
    ("text: best_of above n streamed", "POST", "/v1/completions", text(best_of=2, stream=True), AUTH, 400,
     "invalid_value", "best_of = 2 above n = 1 cannot be streamed: the best are known only once every candidate has "
     "ended"),
    ("text: n 129", "POST", "/v1/completions", text(n=129), AUTH, 400, "invalid_value",
     "n must be between 1 and 128 (got 129)"),
    ("text: logprobs too many", "POST", "/v1/completions", text(logprobs=21), AUTH, 400, "invalid_value",
     "logprobs must be in [0, 20] (got 21)"),
    ("text: echo with logprobs and a suffix", "POST", "/v1/completions", text(echo=True, logprobs=1, suffix="x"),
     AUTH, 400, "unsupported_parameter", "echo with logprobs and a suffix (the prompt's logprobs are of a raw "
     "prompt's tokens) is not supported by specchat"),
    ("text: max_tokens zero", "POST", "/v1/completions", text(max_tokens=0), AUTH, 400, "invalid_value",
     "max_tokens must be between 1 and 32768 (got 0)"),
    ("text: prompt over the context", "POST", "/v1/completions", text(prompt="x" * 300), AUTH, 400,
     "context_length_exceeded",
     "the prompt is 300 tokens, which leaves no room for a reply in the 256-token context: shorten it"),
    ("text: unknown model", "POST", "/v1/completions", text(model="gpt-3.5-turbo-instruct"), AUTH, 404,
     "model_not_found", "model 'gpt-3.5-turbo-instruct' is not served here: this server serves 'tiny'"),
    ("text: no key", "POST", "/v1/completions", text(), {"Content-Type": "application/json"}, 401, "invalid_api_key",
     "missing API key: send the header 'Authorization: Bearer KEY'"),
    ("responses: no input", "POST", "/v1/responses", responses(input=None), AUTH, 400, "missing_field",
     "input is required"),
    ("responses: input a number", "POST", "/v1/responses", responses(input=3), AUTH, 400, "invalid_type",
     "input: input should be a valid string"),
    ("responses: an item without its role", "POST", "/v1/responses", responses(input=[{"content": "hi"}]), AUTH, 400,
     "missing_field", "input[0].role is required: a string"),
    ("responses: max_output_tokens zero", "POST", "/v1/responses", responses(max_output_tokens=0), AUTH, 400,
     "invalid_value", "max_output_tokens must be between 1 and 32768 (got 0)"),
    ("responses: input over the context", "POST", "/v1/responses", responses(input="x" * 300), AUTH, 400,
     "context_length_exceeded",
     "the prompt is 320 tokens, which leaves no room for a reply in the 256-token context: shorten it"),
    ("responses: a stored response named", "POST", "/v1/responses", responses(previous_response_id="resp_1"), AUTH,
     400, "unsupported_parameter", "previous_response_id (this server keeps no responses: send the whole "
     "conversation in input) is not supported by specchat"),
    ("responses: unknown model", "POST", "/v1/responses", responses(model="gpt-5"), AUTH, 404, "model_not_found",
     "model 'gpt-5' is not served here: this server serves 'tiny'"),
    ("responses: no key", "POST", "/v1/responses", responses(), {"Content-Type": "application/json"}, 401,
     "invalid_api_key", "missing API key: send the header 'Authorization: Bearer KEY'"),
]


@pytest.fixture(scope="module")
def server():
    app, _ = make_app([FakeEngine()], api_key=KEY, context=256)
    with serving(app) as url:
        yield url


def send(url: str, method: str, path: str, data: bytes | None, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}{path}", data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_the_table_is_large_enough():
    assert len(CASES) >= 15 and len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "method", "path", "data", "headers", "status", "code", "message"), CASES,
                         ids=[case[0] for case in CASES])
def test_bad_input_is_refused_in_one_line_and_the_server_stays_up(server, caplog, name, method, path, data, headers,
                                                                  status, code, message):
    got_status, got = send(server, method, path, data, headers)
    assert (got_status, got["error"]["code"], got["error"]["message"]) == (status, code, message)
    assert set(got["error"]) == {"message", "type", "param", "code"} and "\n" not in got["error"]["message"]
    assert send(server, "GET", "/health", None, {}) == (200, {"status": "ok"})
    good_status, good = send(server, "POST", "/v1/chat/completions", body(), AUTH)
    assert good_status == 200 and good["choices"][0]["message"]["content"] == "Here"
    assert "Traceback" not in caplog.text and not any(record.exc_info for record in caplog.records)


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
STREAMED = {"model": MODEL, "messages": user("hi"), "stream": True}
# (route, a body that asks a form of the reply, streamed where it can be, the field refused)
FORMS = [
    ("/v1/chat/completions", STREAMED | {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", STREAMED | {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", STREAMED | {"tools": [WEATHER], "tool_choice": "required"}, "tools"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "logprobs": 1, "stream": True}, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "best_of": 2}, "best_of"),  # ranked by logprobs; not streamed
    ("/completion", {"prompt": "hi", "n_probs": 2, "stream": True}, "n_probs"),
    ("/api/chat", {"model": MODEL, "messages": user("hi"), "logprobs": True}, "logprobs"),  # Ollama streams by default
    ("/api/generate", {"model": MODEL, "prompt": "hi", "format": "json"}, "format"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True, "include": ["message.output_text.logprobs"]},
     "include"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True, "text": {"format": {"type": "json_object"}}},
     "text.format"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True, "tool_choice": "required",
                       "tools": [{"type": "function", "name": "weather"}]}, "tools"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": user("hi"), "stream": True,
                      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     "output_config.format"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": user("hi"), "stream": True,
                      "tool_choice": {"type": "any"}, "tools": [{"name": "weather"}]}, "tools"),
]


@pytest.mark.parametrize(("path", "request_body", "field"), FORMS, ids=[f"{p} {f}" for p, _, f in FORMS])
def test_a_form_the_engine_cannot_keep_is_a_400_before_any_stream_opens(path, request_body, field):
    """sd, specinfer and dsi keep no grammar and log no logprobs: a streamed request asking for
    them (best_of ranks candidates by theirs) is refused before the stream's 200, not answered 200
    and then an error event."""
    engine = FakeEngine(name="sd", keeps_forms=False)
    app, _ = make_app([engine])
    with serving(app) as url:
        status, got = send(url, "POST", path, json.dumps(request_body).encode(), {"Content-Type": "application/json"})
    message = got["error"] if path.startswith("/api/") else got["error"]["message"]  # Ollama's shape: a string
    assert status == 400 and message == (f"{field} under --engine sd (serve with specexec or autoregressive) is "
                                         "not supported by specchat")
    assert engine.calls == []  # nothing was queued


class SilentTemplate(CharTokenizer):
    """A chat template that renders nothing of any conversation."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict=False, tools=None):
        return {"input_ids": []} if tokenize else ""


def test_messages_the_template_renders_as_nothing_are_a_400_naming_the_messages():
    engine = FakeEngine()
    with serving_engine(engine, tokenizer=SilentTemplate()) as url:
        status, got = send(url, "POST", "/v1/chat/completions", body(), AUTH)
    assert (status, got["error"]["message"], got["error"]["param"]) == (
        400, "the messages are empty after tokenization", "messages")
    assert engine.calls == []
