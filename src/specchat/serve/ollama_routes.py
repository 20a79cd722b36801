"""Ollama's API beside OpenAI's and llama.cpp's: its routes, each guarded by the server's key, and
each refusal in Ollama's shape ({"error": message}, which Ollama's clients show as it is)."""

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specchat.serve.embeddings import Embeddings
from specchat.serve.endpoint import ServeConfig
from specchat.serve.errors import APIError
from specchat.serve.ollama import OllamaChatRoute, OllamaGenerateRoute
from specchat.serve.ollama_info import ShowRequest, running, server_version, shown, tags
from specchat.serve.ollama_reply import created_at, error_body
from specchat.serve.scheduler import Scheduler
from specchat.serve.schema import parsed

Handler = Callable[[Request], Awaitable[Response]]


def ollama_routes(config: ServeConfig, scheduler: Scheduler, authorize: Callable[[Request], None]) -> list[Route]:
    started = created_at()
    chat, generate = OllamaChatRoute(config, scheduler), OllamaGenerateRoute(config, scheduler)
    embeddings = Embeddings(config, scheduler)

    def guarded(answer: Handler) -> Handler:
        async def route(request: Request) -> Response:
            try:
                authorize(request)
                return await answer(request)
            except APIError as error:
                return JSONResponse(error_body(error), status_code=error.status)
        return route

    async def show(request: Request) -> Response:
        return JSONResponse(shown(config, parsed(await request.body(), ShowRequest), started))

    async def listing(request: Request) -> Response:
        return JSONResponse(tags(config, started))

    async def processes(request: Request) -> Response:
        return JSONResponse(running(config))

    async def about(request: Request) -> Response:
        return JSONResponse(server_version())

    return [
        Route("/api/chat", guarded(chat.respond), methods=["POST"]),
        Route("/api/generate", guarded(generate.respond), methods=["POST"]),
        Route("/api/embed", guarded(embeddings.ollama), methods=["POST"]),
        Route("/api/embeddings", guarded(embeddings.ollama_legacy), methods=["POST"]),  # Ollama's older route
        Route("/api/tags", guarded(listing), methods=["GET"]),
        Route("/api/show", guarded(show), methods=["POST"]),
        Route("/api/ps", guarded(processes), methods=["GET"]),
        Route("/api/version", guarded(about), methods=["GET"]),
    ]
