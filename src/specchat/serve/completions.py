"""One chat completion: the request checked and encoded into a job, queued, and its events
turned into OpenAI's reply, whole or streamed as server-sent events."""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from jinja2 import TemplateError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from transformers import PreTrainedTokenizerBase

from specchat.chat_template import encode_chat
from specchat.decoding.events import SamplingParams
from specchat.decoding.guide import Grammar, Grammars
from specchat.decoding.token_log import TokenLog
from specchat.errors import ContextOverflow, SpecchatError
from specchat.limits import reply_limit
from specchat.serve.errors import APIError, bad_request
from specchat.serve.reply import Chunks, Reply, completion
from specchat.serve.scheduler import Job, QueueFull, Scheduler
from specchat.serve.schema import (ChatRequest, chat_messages, check_model, parse_request, requested_tokens,
                                   sampling_of, stop_strings)
from specchat.serve.stops import StopScan
from specchat.serve.structured import CallHold, call_grammar, forced_functions, functions_of, response_schema
from specchat.textstream import TextStream


@dataclass(frozen=True)
class ServeConfig:
    model: str  # the id clients name in `model`
    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    context: int
    sampling: SamplingParams  # what a request leaves out
    api_key: str | None = None
    log_prompts: bool = False
    grammars: Callable[[], Grammars] | None = None  # the grammar compiler (None: response forms are refused)


class Completions:
    def __init__(self, config: ServeConfig, scheduler: Scheduler) -> None:
        self.config = config
        self.scheduler = scheduler

    async def respond(self, request: Request) -> Response:
        """POST /v1/chat/completions, once the key is checked."""
        chat = parse_request(await request.body())
        check_model(chat, self.config.model)
        job, reply = self.prepare(chat, request)
        try:
            self.scheduler.submit(job)
        except QueueFull as error:
            raise APIError(429, str(error), "queue_full", kind="rate_limit_error") from None
        request.state.tokens = (len(job.prompt_ids), 0)
        if chat.stream:
            include_usage = chat.stream_options is not None and chat.stream_options.include_usage
            return StreamingResponse(self.stream(request, job, reply, include_usage), media_type="text/event-stream")
        return JSONResponse(await self.collect(request, job, reply))

    def prepare(self, chat: ChatRequest, request: Request) -> tuple[Job, Reply]:
        messages = chat_messages(chat)
        if self.config.log_prompts:
            request.state.messages = messages
        functions = [] if chat.tool_choice == "none" else functions_of(chat.tools)
        form = self.form(chat, functions)
        sampling = replace(sampling_of(chat, self.config.sampling), guide=None if form is None else form.start(),
                           token_log=TokenLog(chat.top_logprobs or 0) if chat.logprobs else None)
        stops, wanted = stop_strings(chat), requested_tokens(chat)
        prompt_ids = self.encode(messages, chat.tools if functions else None)
        try:
            max_new_tokens = reply_limit(len(prompt_ids), wanted, self.config.context)
        except ContextOverflow as error:
            raise bad_request(str(error), "context_length_exceeded", "messages") from None
        job = Job(prompt_ids, max_new_tokens, sampling, asyncio.get_running_loop())
        return job, Reply(TextStream(self.config.tokenizer), StopScan(stops), self.config.stop_ids,
                          token_log=sampling.token_log, may_call=bool(functions))

    def form(self, chat: ChatRequest, functions: list[dict]) -> Grammar | None:
        """The grammar the reply keeps to: the response format's schema, or calls of the forced
        tools; None for free text. What the grammar engine cannot compile is a 400."""
        schema, forced = response_schema(chat.response_format), forced_functions(functions, chat.tool_choice)
        if schema is None and not forced:
            return None
        field = "response_format" if schema is not None else "tools"
        if schema is not None and forced:
            raise bad_request("response_format and a tool_choice that forces a call ask two forms of one reply: "
                              "send one", "invalid_value", "tool_choice")
        if self.config.grammars is None:
            raise bad_request(f"{field}: this server's tokenizer takes no grammar", "unsupported_parameter", field)
        try:
            compiler = self.config.grammars()
            return compiler.json_schema(schema) if schema is not None else compiler.lark(call_grammar(forced))
        except SpecchatError as error:
            raise bad_request(str(error), "invalid_value", field) from None

    def encode(self, messages: list[dict], tools: list | None = None) -> list[int]:
        try:
            ids = encode_chat(self.config.tokenizer, messages, tools)
        except TemplateError as error:  # the model's template refuses this conversation's shape
            raise bad_request(f"the model's chat template refuses these messages: {error}", "invalid_messages",
                              "messages") from None
        if not ids:
            raise bad_request("the messages are empty after tokenization", param="messages")
        return ids

    async def collect(self, request: Request, job: Job, reply: Reply) -> dict:
        watcher = asyncio.create_task(self.withdraw_on_disconnect(request, job))
        try:
            text = "".join([piece async for piece in self.pieces(job, reply)]) + reply.finish()
        finally:
            watcher.cancel()
            self.scheduler.withdraw(job)
        request.state.tokens = (len(job.prompt_ids), reply.completion_tokens)
        return completion(self.config.model, text, reply, job)

    async def withdraw_on_disconnect(self, request: Request, job: Job) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.scheduler.withdraw(job)

    async def pieces(self, job: Job, reply: Reply) -> AsyncIterator[str]:
        """The reply's text as it becomes safe to send, until it ends or meets a stop string."""
        try:
            async for event in job.events():
                if text := reply.push(event):
                    yield text
                if reply.stopped:
                    return
        except APIError:
            raise
        except SpecchatError as error:
            raise bad_request(str(error)) from None
        except Exception as error:  # the scheduler logged its traceback; the client gets one line
            raise APIError(500, f"decoding failed: {type(error).__name__}: {error}", "decoding_failed",
                           kind="server_error") from None

    async def stream(self, request: Request, job: Job, reply: Reply, include_usage: bool) -> AsyncIterator[str]:
        chunks = Chunks(self.config.model)
        hold = CallHold() if reply.may_call else None
        try:
            yield sse(chunks.delta({"role": "assistant", "content": ""}))
            async for text in self.pieces(job, reply):
                yield sse(chunks.delta({"content": hold.push(text) if hold else text}, logprobs=reply.new_logprobs()))
            tail, calls = reply.finish(), []
            if hold:
                tail = hold.push(tail)
                rest, calls = hold.finish()
                tail += rest
            if tail or reply.token_log is not None and reply.logged < len(reply.token_log.entries):
                yield sse(chunks.delta({"content": tail}, logprobs=reply.new_logprobs()))
            if calls:
                yield sse(chunks.calls(calls))
            yield sse(chunks.last(reply, job, bool(calls)))
            if include_usage:
                yield sse(chunks.usage(reply, job))
            yield "data: [DONE]\n\n"
        except APIError as error:  # the status is sent already: the error goes in the stream
            yield sse(error.body())
        finally:
            # Reached too when the client disconnects (the stream is cancelled): frees its place.
            self.scheduler.withdraw(job)
            request.state.tokens = (len(job.prompt_ids), reply.completion_tokens)


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
