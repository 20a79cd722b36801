"""What the completion routes share: the server's config, a job queued (429 past the queue's
bound), the reply's text as it becomes safe to send, the form a reply keeps to, and a client's
disconnect withdrawing its job."""

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import StreamingResponse
from transformers import PreTrainedTokenizerBase

from specchat.chat_template import encode_chat
from specchat.decoding.events import Engine, SamplingParams
from specchat.decoding.guide import Grammar, Grammars
from specchat.decoding.penalties import counted_from
from specchat.errors import ContextOverflow, SpecchatError
from specchat.limits import reply_limit
from specchat.decoding.token_log import TokenLog
from specchat.serve.errors import APIError, bad_request, unsupported
from specchat.serve.fim import FimTokens
from specchat.serve.form import Form
from specchat.serve.penalty_fields import Asked
from specchat.serve.prediction import quoting
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job, QueueFull, Scheduler
from specchat.serve.schema import Defaults, through_template
from specchat.serve.stops import StopScan
from specchat.serve.structured import call_grammar
from specchat.textstream import TextStream


DONE = "data: [DONE]\n\n"  # OpenAI's end of a stream


@dataclass(frozen=True)
class ServeConfig:
    model: str  # the id clients name in `model`
    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    context: int
    sampling: Defaults  # what a request leaves out
    api_key: str | None
    log_prompts: bool
    grammars: Callable[[], Grammars] | None  # the grammar compiler (None: response forms are refused)
    fim: FimTokens | None  # the tokenizer's fill-in-the-middle tokens (None: `suffix` is refused)
    pooling: str  # how an embedding pools the target's rows (decoding/embedding.py)

    @property
    def chat_template(self) -> str:
        """The tokenizer's chat template as text ("" where it has none), as /props and /api/show give it."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else ""


class Endpoint:
    media_type = "text/event-stream"  # a streamed reply's: server-sent events (Ollama's routes: lines of JSON)
    stream_end = DONE  # what a streamed reply ends with (OpenAI's chat and text completions'; others end bare)

    def __init__(self, config: ServeConfig, scheduler: Scheduler) -> None:
        self.config = config
        self.scheduler = scheduler

    def job(self, prompt_ids: list[int], wanted: int | None, sampling: SamplingParams, param: str,
            asked: Asked | None = None) -> Job:
        """The job decoding `prompt_ids`, at most `wanted` tokens (None: the room left), under the
        penalties `asked` (counting from the prompt's tokens); a 400 naming `param` when the prompt
        leaves no room."""
        try:
            max_new_tokens = reply_limit(len(prompt_ids), wanted, self.config.context)
        except ContextOverflow as error:
            raise bad_request(str(error), "context_length_exceeded", param) from None
        if sampling.mirostat is not None:
            self.check_kept("mirostat")
        if asked is not None:
            self.check_kept(asked.field)
            sampling = counted_from(sampling, asked.penalties, prompt_ids)
        return Job(prompt_ids, max_new_tokens, sampling, asyncio.get_running_loop())

    def chat_job(self, messages: list[dict], tools: list | None, wanted: int | None, sampling: SamplingParams,
                 param: str, asked: Asked | None = None) -> Job:
        """The job replying to chat `messages` (and `tools`), as `job`, with the code the last
        message quotes as the predicted output where the request sent none (serve/prediction.py):
        the job's sampling only, so that the reply's usage counts the client's prediction alone."""
        return self.job(self.chat_ids(messages, tools), wanted, quoting(sampling, messages, self.config.tokenizer),
                        param, asked)

    def reply(self, stops: list[str], sampling: SamplingParams, may_call: bool = False) -> Reply:
        return Reply(TextStream(self.config.tokenizer), StopScan(stops), self.config.stop_ids,
                     token_log=sampling.token_log, prediction=sampling.prediction, may_call=may_call)

    def check_kept(self, field: str) -> None:
        """A 400 naming `field`, a form of the reply (a grammar, tokens' logprobs, penalties) the served engine
        cannot keep: refused before anything is queued, so a stream never opens only to fail."""
        engine = self.scheduler.slots[0].engine  # every slot's is the same kind
        if not engine.keeps_forms:
            raise unsupported(f"{field} under --engine {engine.name} (serve with specexec or autoregressive) is",
                              field)

    def logged(self, log: TokenLog | None, field: str) -> TokenLog | None:
        """`log`, where the request asks for its tokens' logprobs (in `field`) and the engine keeps them."""
        if log is not None:
            self.check_kept(field)
        return log

    def queue(self, request: Request, job: Job) -> None:
        try:
            self.scheduler.submit(job)
        except QueueFull as error:
            raise APIError(429, str(error), "queue_full", kind="rate_limit_error") from None
        request.state.tokens = (len(job.prompt_ids), 0)

    def form(self, asked: Form | None) -> Grammar | None:
        """The grammar the reply keeps to (serve/form.py), None for free text; what the grammar
        engine cannot compile is a 400 pointing at the field that asked for it."""
        if asked is None:
            return None
        self.check_kept(asked.field)
        if self.config.grammars is None:
            raise bad_request(f"{asked.field}: this server's tokenizer takes no grammar", "unsupported_parameter",
                              asked.field)
        try:
            compiler = self.config.grammars()
            if asked.schema is not None:
                return compiler.json_schema(asked.schema)
            return compiler.grammar(asked.grammar) if asked.grammar is not None else compiler.lark(
                call_grammar(asked.calls, asked.one_call))
        except SpecchatError as error:
            raise bad_request(str(error), "invalid_value", asked.field) from None

    async def collect(self, request: Request, job: Job, reply: Reply, texts: AsyncIterator[str] | None = None) -> str:
        """The whole reply's text (`texts`: its pieces, when not `texts(job, reply)`'s), once it has
        ended; a disconnect withdraws the job. The log counts the tokens decoded however it ends, a
        failure's too (as a stream's does)."""
        watcher = asyncio.create_task(self.withdraw_on_disconnect(request, job))
        try:
            return "".join([piece async for piece in texts or self.texts(job, reply)])
        finally:
            watcher.cancel()
            self.scheduler.withdraw(job)
            request.state.tokens = (len(job.prompt_ids), reply.completion_tokens)

    async def computed(self, request: Request, prompt_ids: list[int],
                       work: Callable[[Engine, threading.Event], object], keeps: bool = False) -> object:
        """What `work` returns, run on an engine on the decoding thread once the requests before
        it are done (a prompt's embedding or its logprobs: it never runs beside a reply on the same
        weights); `prompt_ids` are the tokens it runs, as counted; `keeps`: the work leaves them in
        the engine's caches (serve/scheduler.py). A disconnect withdraws it."""
        job = Job(prompt_ids, 0, SamplingParams(), asyncio.get_running_loop(), work=work, keeps=keeps)
        self.queue(request, job)
        watcher = asyncio.create_task(self.withdraw_on_disconnect(request, job))
        try:
            with answered_failures("the target's pass", "pass_failed"):
                return await job.result()
        finally:
            watcher.cancel()
            self.scheduler.withdraw(job)

    async def withdraw_on_disconnect(self, request: Request, job: Job) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.scheduler.withdraw(job)

    async def texts(self, job: Job, reply: Reply) -> AsyncIterator[str]:
        """The whole reply's text in pieces: what `pieces` sends, then the tail held back."""
        async for text in self.pieces(job, reply):
            yield text
        yield reply.finish()

    async def pieces(self, job: Job, reply: Reply) -> AsyncIterator[str]:
        """The reply's text as it becomes safe to send, until it ends or meets a stop string."""
        with answered_failures("decoding", "decoding_failed"):
            async for event in job.events():
                if text := reply.push(event):
                    yield text
                if reply.stopped:
                    return

    def streamed(self, request: Request, job: Job, reply: Reply, chunks: AsyncIterator[dict]) -> StreamingResponse:
        """A reply streamed: its chunks framed as this API frames them (`events`)."""
        return self.streamed_all(request, [(job, reply)], chunks)

    def streamed_all(self, request: Request, replies: list[tuple[Job, Reply]], chunks: AsyncIterator[dict],
                     per_prompt: int = 1) -> StreamingResponse:
        """Several replies streamed in one response: a batch of prompts', `per_prompt` choices each (n)."""
        return StreamingResponse(self.events(request, replies, chunks, per_prompt), media_type=self.media_type)

    async def events(self, request: Request, replies: list[tuple[Job, Reply]], chunks: AsyncIterator[dict],
                     per_prompt: int = 1) -> AsyncIterator[str]:
        """A streamed response's chunks as server-sent events, then `stream_end`; an error once the
        status is sent goes in the stream. The jobs' places are freed however the stream ends: this is
        reached too when the client disconnects (the stream is cancelled). The log counts a prompt's
        tokens once, however many choices it has (as usage does)."""
        try:
            async for chunk in chunks:
                yield self.frame(chunk)
            yield self.stream_end
        except APIError as error:
            yield self.frame(self.error_body(error))
        finally:
            for job, _ in replies:
                self.scheduler.withdraw(job)
            request.state.tokens = (sum(len(job.prompt_ids) for job, _ in replies[::per_prompt]),
                                    sum(reply.completion_tokens for _, reply in replies))

    def chat_ids(self, messages: list[dict], tools: list | None = None) -> list[int]:
        """The prompt ids of chat `messages` (and `tools`) through the model's chat template."""
        tokenizer = self.config.tokenizer
        ids = through_template(tokenizer, lambda: encode_chat(tokenizer, messages, tools))
        if not ids:
            raise bad_request("the messages are empty after tokenization", param="messages")
        return ids

    @staticmethod
    def frame(chunk: dict) -> str:
        """A streamed chunk on the wire: a server-sent event (Ollama's routes: a line of JSON)."""
        return sse(chunk)

    @staticmethod
    def error_body(error: APIError) -> dict:
        """A refusal's body in this API's shape (OpenAI's here)."""
        return error.body()


@contextmanager
def answered_failures(what: str, code: str) -> Iterator[None]:
    """An engine's failure, raised on the decoding thread, as the client's one line: its refusal (a
    SpecchatError) a 400, anything else a 500 with `code` (the scheduler logged its traceback)."""
    try:
        yield
    except APIError:
        raise
    except SpecchatError as error:
        raise bad_request(str(error)) from None
    except Exception as error:
        raise APIError(500, f"{what} failed: {type(error).__name__}: {error}", code, kind="server_error") from None


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
