"""One log line per request: method, path, status, tokens and seconds (and the messages, or a
text completion's prompt and suffix, only when the server runs with --log-prompts); the same
answer counted in the server's metrics."""

import json
import logging
from time import perf_counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specchat.serve.metrics import ServeMetrics

logger = logging.getLogger("specchat.serve")

LOGGED = ("messages", "prompt", "suffix")  # a chat's messages; a text completion's prompt and suffix


class RequestLog:
    """ASGI middleware: logs each request's line and counts its answer in `metrics`; a handler
    leaves `tokens` (prompt, completion) and, with --log-prompts, what LOGGED names in the
    request's state for the line."""

    def __init__(self, app: ASGIApp, log_prompts: bool, metrics: ServeMetrics) -> None:
        self.app = app
        self.log_prompts = log_prompts
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        start, seen = perf_counter(), {"status": 0, "complete": False}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                seen["complete"] = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds, status = perf_counter() - start, seen["status"] or 500
            logger.info(self.line(scope, state, status, seen["complete"], seconds))
            self.metrics.on_answer(scope["path"], status, seconds)

    def line(self, scope: Scope, state: dict, status: int, complete: bool, seconds: float) -> str:
        parts = [scope["method"], scope["path"], str(status)]
        if "tokens" in state:
            prompt, completion = state["tokens"]
            parts.append(f"tokens {prompt}+{completion}")
        parts.append(f"{seconds:.3f}s")
        if not complete:
            parts.append("incomplete")  # the client left, or the server failed
        if self.log_prompts:
            parts += [f"{name} {json.dumps(state[name], ensure_ascii=False)}" for name in LOGGED if name in state]
        return " ".join(parts)
