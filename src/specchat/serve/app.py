"""The HTTP application: routes, key check, and the chat completion of one request, streamed
(server-sent events) or not."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from transformers import PreTrainedTokenizerBase

from specchat.chat_template import encode_chat
from specchat.decoding.events import SamplingParams
from specchat.errors import SpecchatError
from specchat.serve.errors import APIError, api_error_response, bad_request, http_error_response
from specchat.serve.logs import RequestLog
from specchat.serve.reply import Chunks, Reply, completion
from specchat.serve.scheduler import Job, QueueFull, Scheduler
from specchat.serve.schema import (ChatRequest, chat_messages, check_model, parse_request, requested_tokens,
                                   sampling_of, stop_strings)
from specchat.serve.stops import StopScan
from specchat.textstream import TextStream


@dataclass(frozen=True)
class ServeConfig:
    model: str  # the id clients name in `model`
    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    context_tokens: int
    sampling: SamplingParams  # what a request leaves out
    api_key: str | None = None
    log_prompts: bool = False


def build_app(config: ServeConfig, scheduler: Scheduler) -> Starlette:
    created = int(time.time())

    def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {config.api_key}":
            given = "missing" if "authorization" not in request.headers else "wrong"
            raise APIError(401, f"{given} API key: send the header 'Authorization: Bearer KEY'", "invalid_api_key")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [model_card(config.model, created)]})

    async def model(request: Request) -> Response:
        authorize(request)
        if request.path_params["model"] != config.model:
            raise APIError(404, f"model '{request.path_params['model']}' is not served here: this server serves "
                           f"'{config.model}'", "model_not_found", "model")
        return JSONResponse(model_card(config.model, created))

    async def chat_completions(request: Request) -> Response:
        authorize(request)
        chat = parse_request(await request.body())
        check_model(chat, config.model)
        job, reply = prepare(chat, request)
        try:
            scheduler.submit(job)
        except QueueFull as error:
            raise APIError(429, str(error), "queue_full", kind="rate_limit_error") from None
        request.state.tokens = (len(job.prompt_ids), 0)
        if chat.stream:
            include_usage = chat.stream_options is not None and chat.stream_options.include_usage
            return StreamingResponse(stream(request, job, reply, include_usage), media_type="text/event-stream")
        return JSONResponse(await collect(request, job, reply))

    def prepare(chat: ChatRequest, request: Request) -> tuple[Job, Reply]:
        messages = chat_messages(chat)
        if config.log_prompts:
            request.state.messages = messages
        sampling, stops, wanted = sampling_of(chat, config.sampling), stop_strings(chat), requested_tokens(chat)
        prompt_ids = encode(messages)
        room = config.context_tokens - len(prompt_ids)
        if room < 1:
            raise bad_request(f"the messages take {len(prompt_ids)} tokens, leaving no room in the model's "
                              f"{config.context_tokens}-token context: shorten them", "context_length_exceeded",
                              "messages")
        job = Job(prompt_ids, min(wanted or room, room), sampling, asyncio.get_running_loop())
        return job, Reply(TextStream(config.tokenizer), StopScan(stops), config.stop_ids)

    def encode(messages: list[dict]) -> list[int]:
        try:
            ids = encode_chat(config.tokenizer, messages)
        except TemplateError as error:  # the model's template refuses this conversation's shape
            raise bad_request(f"the model's chat template refuses these messages: {error}", "invalid_messages",
                              "messages") from None
        if not ids:
            raise bad_request("the messages are empty after tokenization", param="messages")
        return ids

    async def collect(request: Request, job: Job, reply: Reply) -> dict:
        watcher = asyncio.create_task(withdraw_on_disconnect(request, job))
        try:
            text = "".join([piece async for piece in pieces(job, reply)]) + reply.finish()
        finally:
            watcher.cancel()
            scheduler.withdraw(job)
        request.state.tokens = (len(job.prompt_ids), reply.completion_tokens)
        return completion(config.model, text, reply, job)

    async def withdraw_on_disconnect(request: Request, job: Job) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        scheduler.withdraw(job)

    async def pieces(job: Job, reply: Reply) -> AsyncIterator[str]:
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

    async def stream(request: Request, job: Job, reply: Reply, include_usage: bool) -> AsyncIterator[str]:
        chunks = Chunks(config.model)
        try:
            yield sse(chunks.delta({"role": "assistant", "content": ""}))
            async for text in pieces(job, reply):
                yield sse(chunks.delta({"content": text}))
            if tail := reply.finish():
                yield sse(chunks.delta({"content": tail}))
            yield sse(chunks.last(reply, job))
            if include_usage:
                yield sse(chunks.usage(reply, job))
            yield "data: [DONE]\n\n"
        except APIError as error:  # the status is sent already: the error goes in the stream
            yield sse(error.body())
        finally:
            # Reached too when the client disconnects (the stream is cancelled): frees its place.
            scheduler.withdraw(job)
            request.state.tokens = (len(job.prompt_ids), reply.completion_tokens)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        yield
        await asyncio.to_thread(scheduler.close)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(RequestLog, log_prompts=config.log_prompts)],
                    exception_handlers={APIError: api_error_response, HTTPException: http_error_response})
    app.state.scheduler = scheduler  # stopped first at shutdown (listen.server_for)
    return app


def model_card(model: str, created: int) -> dict:
    return {"id": model, "object": "model", "created": created, "owned_by": "specchat"}


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
