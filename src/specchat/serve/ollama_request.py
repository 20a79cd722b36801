"""Ollama's requests (POST /api/chat, /api/generate), as oterm, Open WebUI and editor plugins send
them: their bodies checked as the OpenAI routes' are (pydantic, strictly), and mapped onto what
the engines take. Options that size Ollama's own runner (num_ctx, num_gpu, num_thread...) are
ignored, as unknown fields are on every route; each refusal is one line."""

from typing import Any

from specchat.serve.errors import APIError, bad_request, unsupported
from specchat.serve.schema import MAX_TOP_LOGPROBS, ROLES, Strict, check_role, token_limit
from specchat.serve.structured import template_calls


class OllamaOptions(Strict):
    """The options that change a reply."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    top_n_sigma: float | None = None  # llama.cpp's, which Ollama's runner leaves out: taken as on every route
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    dynatemp_range: float | None = None  # llama.cpp's dynamic temperature, taken as on every route
    dynatemp_exponent: float | None = None
    mirostat: int | None = None  # 1 or 2, in place of the cuts (left out: off)
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    seed: int | None = None
    repeat_penalty: float | None = None  # left out: 1, off (Ollama's llama.cpp runner takes 1.1)
    repeat_last_n: int | None = None  # left out: 64
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None  # llama.cpp's DRY, which Ollama's runner leaves out: taken as on every route
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    num_predict: int | None = None  # -1: to the end of the context (as -2, Ollama's "fill the context")
    stop: list[str] | None = None


class OllamaMessage(Strict):
    role: str
    content: str | None = None  # absent or null beside a call: no text
    images: list[Any] | None = None
    tool_calls: list[Any] | None = None  # Ollama's: {"function": {"name", "arguments": {...}}}
    tool_name: str | None = None  # a tool's reply names its tool, where OpenAI's names the call


class OllamaBody(Strict):
    """What both routes hold. A reply streams unless `stream` is false (Ollama's default)."""

    model: str
    options: OllamaOptions = OllamaOptions()
    format: str | dict[str, Any] | None = None  # "json", or a JSON schema
    stream: bool = True
    think: bool | str | None = None
    logprobs: bool = False
    top_logprobs: int = 0


class OllamaChat(OllamaBody):
    messages: list[OllamaMessage] = []  # none: Ollama loads the model and answers done_reason "load"
    tools: list[Any] | None = None


class OllamaGenerate(OllamaBody):
    prompt: str = ""  # empty, with no suffix: Ollama loads the model and answers done_reason "load"
    suffix: str | None = None
    system: str | None = None
    raw: bool = False  # the prompt as it is, not through the chat template
    template: str | None = None
    images: list[Any] | None = None
    context: list[int] | None = None  # an earlier answer's `context` (Ollama's, deprecated): the prompt goes after it


def check_ollama_model(asked: str, served: str) -> None:
    """A 404 unless `asked` names the served model (Ollama's ':latest' tag names it too)."""
    if asked.removesuffix(":latest") != served.removesuffix(":latest"):
        raise APIError(404, f"model '{asked}' not found: this server serves '{served}'", "model_not_found", "model")


def check_ollama_features(body: OllamaBody) -> None:
    if body.think not in (None, False, ""):
        raise bad_request("think: this model does not think (it has no reasoning mode)", "invalid_value", "think")
    if not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {body.top_logprobs})",
                          "invalid_value", "top_logprobs")


def check_generate_features(body: OllamaGenerate) -> None:
    if body.images:
        raise unsupported("images are", "images")
    if body.template:
        raise unsupported("template (a Go template in place of the model's chat template) is", "template")
    if body.raw and body.system:
        raise bad_request("system: a raw prompt reaches the model as it is, with no system message (as in Ollama's "
                          "raw mode)", "invalid_value", "system")


def format_schema(form: str | dict[str, Any] | None) -> dict | None:
    """The JSON schema `format` asks the reply to keep to (any object for "json"), None for free text."""
    if form in (None, ""):
        return None
    if form == "json":
        return {"type": "object"}
    if isinstance(form, dict):
        return form
    raise bad_request(f"format: '{form}' is neither \"json\" nor a JSON schema", "invalid_value", "format")


def wanted_tokens(options: OllamaOptions) -> int | None:
    """num_predict, or None (the room left in the context) where it is left out or negative."""
    if options.num_predict is None or options.num_predict < 0:
        return None
    return token_limit("options.num_predict", options.num_predict)


def chat_messages(messages: list[OllamaMessage]) -> list[dict]:
    """The messages as the chat template takes them; a tool's reply goes as the tool role's."""
    return [template_message(index, message) for index, message in enumerate(messages)]


def template_message(index: int, message: OllamaMessage) -> dict:
    where = f"messages[{index}]"
    check_role(where, message.role)
    if message.images:
        raise unsupported("images are", f"{where}.images")
    if message.tool_calls and message.role == "assistant":
        calls = template_calls(message.tool_calls, where)
        return {"role": "assistant", "content": message.content or "", "tool_calls": calls}
    return {"role": ROLES[message.role], "content": message.content or ""}
