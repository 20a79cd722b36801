"""The HTTP application: routes, the key check, the request log, the metrics and the scheduler's life."""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from transformers import PreTrainedTokenizerBase

from specchat.serve.anthropic import anthropic_routes
from specchat.serve.completions import ChatCompletions
from specchat.serve.embeddings import Embeddings
from specchat.serve.endpoint import ServeConfig
from specchat.serve.errors import APIError, api_error_response, http_error_response
from specchat.serve.infill import Infill
from specchat.serve.logs import RequestLog
from specchat.serve.native_completion import NativeCompletion
from specchat.serve.ollama_routes import ollama_routes
from specchat.serve.metrics import CONTENT_TYPE, ServeMetrics
from specchat.serve.props import props
from specchat.serve.responses import Responses
from specchat.serve.scheduler import Scheduler
from specchat.serve.schema import Body, parsed
from specchat.serve.text_completions import TextCompletions
from specchat.serve.tokens import (DetokenizeRequest, TemplateRequest, TokenizeRequest, detokenized, templated,
                                   tokenized)


class Responder(Protocol):
    """An endpoint that decodes: it answers a request whose key was checked."""

    async def respond(self, request: Request) -> Response: ...


def build_app(config: ServeConfig, scheduler: Scheduler) -> Starlette:
    created = int(time.time())
    engine = scheduler.slots[0].engine.name  # every slot's is the same kind

    def authorize(request: Request, header: str = "Authorization: Bearer KEY") -> None:
        """The key, as OpenAI's clients send it or as Anthropic's do (`x-api-key`); a refusal names
        `header`, the one this route's clients send."""
        if config.api_key is None:
            return
        keys = (request.headers.get("authorization"), request.headers.get("x-api-key"))
        if f"Bearer {config.api_key}" != keys[0] and config.api_key != keys[1]:
            given = "missing" if keys == (None, None) else "wrong"
            raise APIError(401, f"{given} API key: send the header '{header}'", "invalid_api_key")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [model_card(config, created)]})

    async def model(request: Request) -> Response:
        authorize(request)
        if request.path_params["model"] != config.model:
            raise APIError(404, f"model '{request.path_params['model']}' is not served here: this server serves "
                           f"'{config.model}'", "model_not_found", "model")
        return JSONResponse(model_card(config, created))

    async def server_props(request: Request) -> Response:
        authorize(request)
        return JSONResponse(props(config, len(scheduler.slots), engine))

    async def metrics(request: Request) -> Response:
        authorize(request)
        return Response(figures.exposition(), media_type=CONTENT_TYPE)

    def decoding(endpoint: Responder) -> Callable[[Request], Awaitable[Response]]:
        """A route that decodes: the key checked, then the endpoint's answer."""
        return guarded(endpoint.respond)

    def guarded(answer: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """`answer`, once the key is checked."""
        async def route(request: Request) -> Response:
            authorize(request)
            return await answer(request)
        return route

    def tokenizing(answer: Callable[[PreTrainedTokenizerBase, Body], dict],
                   kind: type[Body]) -> Callable[[Request], Awaitable[Response]]:
        """A route the tokenizer alone answers (serve/tokens.py): the key checked, the body parsed."""
        async def route(request: Request) -> Response:
            authorize(request)
            return JSONResponse(answer(config.tokenizer, parsed(await request.body(), kind)))
        return route

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        yield
        await asyncio.to_thread(scheduler.close)

    embeddings = Embeddings(config, scheduler)
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/props", server_props, methods=["GET"]),  # llama.cpp's: the context, defaults, slots
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", decoding(ChatCompletions(config, scheduler)), methods=["POST"]),
        Route("/v1/completions", decoding(TextCompletions(config, scheduler)), methods=["POST"]),
        Route("/v1/responses", decoding(Responses(config, scheduler)), methods=["POST"]),  # for agents
        Route("/v1/embeddings", guarded(embeddings.openai), methods=["POST"]),
        # llama.cpp's own: /infill for its editor plugins, /completion for its scripts
        Route("/infill", decoding(Infill(config, scheduler)), methods=["POST"]),
        Route("/completion", decoding(NativeCompletion(config, scheduler)), methods=["POST"]),
        Route("/embedding", guarded(embeddings.native), methods=["POST"]),
        Route("/embeddings", guarded(embeddings.native), methods=["POST"]),
        # and its tokenizer's, for scripts that count tokens or template chats themselves
        Route("/tokenize", tokenizing(tokenized, TokenizeRequest), methods=["POST"]),
        Route("/detokenize", tokenizing(detokenized, DetokenizeRequest), methods=["POST"]),
        Route("/apply-template", tokenizing(templated, TemplateRequest), methods=["POST"]),
        *ollama_routes(config, scheduler, authorize),  # Ollama's API, for oterm, Open WebUI and the like
        *anthropic_routes(config, scheduler, authorize),  # Anthropic's Messages API, for Claude Code
    ]
    figures = ServeMetrics(config.model, engine, scheduler,
                           frozenset(route.path for route in routes))
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(RequestLog, log_prompts=config.log_prompts, metrics=figures)],
                    exception_handlers={APIError: api_error_response, HTTPException: http_error_response})
    app.state.scheduler = scheduler  # stopped first at shutdown (listen.server_for)
    return app


def model_card(config: ServeConfig, created: int) -> dict:
    """OpenAI's model object, with the context window as vLLM lists it (`max_model_len`: oterm and
    other front ends size a conversation by it)."""
    return {"id": config.model, "object": "model", "created": created, "owned_by": "specchat",
            "max_model_len": config.context}

