"""What the server's tests share: a character tokenizer with a chat template, apps over fake or
tiny engines, and a uvicorn server on a free 127.0.0.1 port that stops when the test ends."""

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import openai
import pytest
from pydantic import BaseModel
from starlette.applications import Starlette

from specchat.decoding.events import Engine
from specchat.decoding.guide import Grammars
from specchat.errors import SpecchatError
from specchat.limits import DEFAULT_POOLING
from specchat.serve.app import build_app
from specchat.serve.endpoint import ServeConfig
from specchat.serve.errors import APIError
from specchat.serve.fim import FimTokens
from specchat.serve.listen import bind, server_for, url_of
from specchat.serve.scheduler import Scheduler
from specchat.serve.schema import Defaults
from specchat.tui.fake import FakeEngine

MODEL = "tiny"


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The event loop a job's inbox belongs to, closed when the test ends."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
START_S = 10  # a server that has not started by then fails its test


class CharTokenizer:
    """One token per character: token t is chr(offset + t), and a character encodes back to its
    token, so a reply decoded to text and sent back encodes to the very tokens produced.

    Chat template: <tools>name,...</> when tools are declared, <role>content</> per message, then
    <assistant> for the reply.
    """

    chat_template = "<role>content</>"

    def __init__(self, offset: int = 0, vocab: int = 0x110000) -> None:
        self.offset, self.vocab = offset, vocab

    def encode(self, text: str, **options) -> list[int]:  # no special tokens here: the options change nothing
        return [(ord(char) - self.offset) % self.vocab for char in text]

    def __len__(self) -> int:
        return self.vocab

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict=False, tools=None):
        declared = f"<tools>{','.join(t['function']['name'] for t in tools)}</>" if tools else ""
        text = declared + "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        text += "<assistant>" if add_generation_prompt else ""
        return {"input_ids": self.encode(text)} if tokenize else text

    def convert_ids_to_tokens(self, token: int) -> str:
        return chr(self.offset + token)

    def decode(self, token_ids, skip_special_tokens=True):
        return "".join(chr(self.offset + token) for token in token_ids)

    def batch_decode(self, sequences):
        return [self.decode(ids) for ids in sequences]


TINY_TOKENIZER = CharTokenizer(offset=20000, vocab=50)  # the tiny models' 50 tokens, round-tripping
ASCII_TOKENIZER = CharTokenizer(vocab=128)  # a token a character, "\n" and ":" among them (DRY's breakers)


# A reply of two parallel calls of a "weather" tool, as Qwen2.5's template writes calls.
TWO_CALLS = ('<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>\n'
             '<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call>')


class Answer(BaseModel):
    """A structured reply's type, as a client's parse helper takes one."""

    answer: int


class RecordingGrammars:
    """A grammar compiler (served as `grammars`) recording what each request's form compiled to;
    each guide it makes starts as "guide N", N its place in the record. A grammar holding
    "nowhere" is refused as llguidance refuses a rule it cannot find."""

    def __init__(self) -> None:
        self.compiled: list[tuple[str, object]] = []

    def grammar(self, text: str):
        if "nowhere" in text:
            raise SpecchatError("the grammar cannot be compiled: Rule 'nowhere' not found")
        return self.recorded("grammar", text)

    def json_schema(self, schema: dict):
        return self.recorded("schema", schema)

    def lark(self, text: str):
        return self.recorded("lark", text)

    def recorded(self, kind: str, form: object) -> SimpleNamespace:
        self.compiled.append((kind, form))
        number = len(self.compiled)
        return SimpleNamespace(start=lambda: f"guide {number}")


def make_app(engines: list[Engine], tokenizer=None, stop_ids=frozenset({ord(".")}), context: int = 4096,
             max_queue: int = 16, api_key: str | None = None, log_prompts: bool = False,
             sampling: Defaults = Defaults(), fim: FimTokens | None = None,
             grammars: Callable[[], Grammars] | None = None,
             pooling: str = DEFAULT_POOLING) -> tuple[Starlette, Scheduler]:
    config = ServeConfig(model=MODEL, tokenizer=tokenizer or CharTokenizer(), stop_ids=frozenset(stop_ids),
                         context=context, sampling=sampling, api_key=api_key, log_prompts=log_prompts,
                         grammars=grammars, fim=fim, pooling=pooling)
    scheduler = Scheduler(engines, max_queue)
    return build_app(config, scheduler), scheduler


@contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """The app served on a free 127.0.0.1 port: yields its base URL; stops on exit."""
    sock = bind("127.0.0.1", 0)
    server = server_for(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(START_S)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


@contextmanager
def serving_engine(engine: Engine, **app_options) -> Iterator[str]:
    """`engine` alone served (make_app's options): yields the base URL."""
    app, _ = make_app([engine], **app_options)
    with serving(app) as url:
        yield url


@contextmanager
def serving_recorded(**app_options) -> Iterator[tuple[FakeEngine, RecordingGrammars, str]]:
    """A fake engine served with a recording grammar compiler (make_app's options): yields the
    engine, the compiler and the base URL."""
    engine, compiler = FakeEngine(), RecordingGrammars()
    app, _ = make_app([engine], grammars=lambda: compiler, **app_options)
    with serving(app) as url:
        yield engine, compiler, url


def prompt_of(engine: FakeEngine) -> str:
    """The last prompt a fake engine decoded, as text (a token a character)."""
    return "".join(map(chr, engine.calls[-1][0]))


def client(url: str, api_key: str = "unused") -> openai.OpenAI:
    # No retries: a 429 or a failure must reach the test as it happened.
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def post_json(url: str, body: dict) -> dict:
    """POST `body` to `url` (a route of llama.cpp's own), its JSON answer."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def post_refused(url: str, body: dict) -> tuple[int, str]:
    """The status and error message of a POST that must be refused."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        post_json(url, body)
    return refused.value.code, json.load(refused.value)["error"]["message"]


def post_streamed(url: str, body: dict) -> list[str]:
    """A streamed POST's server-sent event lines, as sent."""
    request = urllib.request.Request(url, data=json.dumps(body | {"stream": True}).encode())
    with urllib.request.urlopen(request) as response:
        return [line for line in response.read().decode().split("\n") if line]


def refusal(call: Callable, *args) -> tuple[int, str, str | None]:
    """What `call(*args)` refuses with: the APIError's status, message and param."""
    with pytest.raises(APIError) as refused:
        call(*args)
    return refused.value.status, refused.value.message, refused.value.param
