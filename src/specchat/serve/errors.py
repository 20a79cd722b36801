"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with their status."""

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse


class APIError(Exception):
    """A request the server refuses: answered with `status` and one clear line, never a traceback."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, code: str = "invalid_value", param: str | None = None) -> APIError:
    return APIError(400, message, code, param)


def unsupported(feature: str, param: str) -> APIError:
    return APIError(400, f"{feature} not supported by specchat", "unsupported_parameter", param)


async def api_error_response(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, APIError)
    return JSONResponse(error.body(), status_code=error.status)


# Starlette's own refusals (no such route, wrong method), reworded in OpenAI's shape.
ROUTING_CODES = {404: "unknown_url", 405: "method_not_allowed"}


async def http_error_response(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        message = f"unknown path: {request.method} {request.url.path}"
    elif error.status_code == 405:
        message = f"method {request.method} not allowed on {request.url.path}"
    else:
        message = str(error.detail)
    code = ROUTING_CODES.get(error.status_code, "http_error")
    return JSONResponse(APIError(error.status_code, message, code).body(), status_code=error.status_code,
                        headers=error.headers)
