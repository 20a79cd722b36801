"""The completion requests: their JSON types checked by pydantic (strictly: "10" is not a
number), their values and the features specchat does not offer checked here, each refusal one
line. The chat request is here; the text completion's fields are serve/text_request.py's; tools,
tool calls and response formats are serve/structured.py's."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import PreTrainedTokenizerBase

from specchat.decoding.events import SamplingParams
from specchat.decoding.reply_sampling import reply_sampling
from specchat.limits import (DEFAULT_REPEAT_LAST_N, DEFAULT_TEMPERATURE, DEFAULT_TOP_P, MAX_TOKENS, SAMPLING_BOUNDS,
                             SEED_LIMIT, fresh_seed)
from specchat.serve.choices import choice_count
from specchat.serve.errors import APIError, bad_request, unsupported
from specchat.serve.structured import template_calls

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_TOP_LOGPROBS = 20  # as OpenAI


@dataclass(frozen=True)
class Defaults:
    """The sampling a request leaves out: the server's --temperature, --top-p, --seed, --top-k, --min-p,
    --typical-p, --top-n-sigma, --xtc-probability and --xtc-threshold, --dynatemp-range and --dynatemp-exponent,
    --mirostat (its tau and eta), and llama-server's penalties (serve/penalty_fields.py: how a request's mix in)."""

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    seed: int | None = None  # None: a fresh seed each request, as OpenAI's, vLLM's and Ollama's servers draw
    top_k: int = 0  # 0: no cut
    min_p: float = 0.0
    typical_p: float = 1.0  # 1: no cut
    top_n_sigma: float = -1.0  # <= 0: no cut
    xtc_probability: float = 0.0  # 0: no XTC
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0  # 0: a fixed temperature
    dynatemp_exponent: float = 1.0
    mirostat: int = 0  # 0: off
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    repeat_penalty: float = 1.0  # 1, 0 and 0: no penalty
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0  # 0: no DRY
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1

    @property
    def penalizes(self) -> bool:
        """Whether a request that sets no penalty gets one."""
        return (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.dry_multiplier != 0.0)


class Strict(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do (clients send `user`, penalties...).
    model_config = ConfigDict(strict=True, extra="allow")


class Message(Strict):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class StreamOptions(Strict):
    include_usage: bool = False


class Decoded(Strict):
    """What every completion request holds: the model, the sampling, stop strings and streaming."""

    CHOICES: ClassVar[bool] = False  # whether the route answers n > 1 (serve/choices.py)

    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's and llama.cpp's: left out, no cut
    min_p: float | None = None
    typical_p: float | None = None  # llama.cpp's and HF's locally typical sampling; left out: no cut
    top_n_sigma: float | None = None  # llama.cpp's (decoding/llama_cuts.py); left out: no cut
    xtc_probability: float | None = None  # llama.cpp's XTC; left out: none
    xtc_threshold: float | None = None  # left out: 0.1
    dynatemp_range: float | None = None  # llama.cpp's dynamic temperature (decoding/dynatemp.py); left out: off
    dynatemp_exponent: float | None = None  # left out: 1
    mirostat: int | None = None  # llama.cpp's and Ollama's: 1 or 2, in place of the cuts; left out: off
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None  # left out: 0, no penalty (serve/penalty_fields.py)
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM's, on the OpenAI routes
    repeat_penalty: float | None = None  # llama.cpp's (its OpenAI routes take it too); left out: 1, off
    repeat_last_n: int | None = None  # llama.cpp's window of counted tokens; left out: 64
    dry_multiplier: float | None = None  # llama.cpp's DRY (decoding/dry.py); left out: off
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None  # left out: -1, the whole context
    dry_sequence_breakers: list[str] | None = None  # left out: llama.cpp's "\n", ":", "\"", "*"
    logit_bias: Any = None  # OpenAI's {"id": bias}; llama.cpp's also [[id or text, bias or false], ...]
    json_schema: dict[str, Any] | None = None  # llama.cpp's: the reply a JSON document valid under it
    grammar: str | None = None  # llama.cpp's: the reply in the language of a GBNF (or Lark) grammar
    stop: str | list[str] | None = None
    stream: bool | None = None  # null is false: the openai client sends stream=None as null
    stream_options: StreamOptions | None = None
    n: int | None = None


class ChatRequest(Decoded):
    CHOICES: ClassVar[bool] = True
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None  # OpenAI's predicted output (serve/prediction.py)


Request = TypeVar("Request", bound=Decoded)
Body = TypeVar("Body", bound=Strict)
Rendered = TypeVar("Rendered")


def parse_body(body: bytes, kind: type[Request]) -> Request:
    """The request, or `parsed`'s 400; a 400 for n outside [1, MAX_CHOICES], or above 1 on a one-choice route."""
    request = parsed(body, kind)
    if choice_count(request.n) != 1 and not kind.CHOICES:
        raise unsupported(f"n = {request.n}: several choices (n > 1) on this route are", "n")
    return request


def parsed(body: bytes, kind: type[Body]) -> Body:
    """The body as `kind`, or a 400: malformed JSON, or the first field missing or of the wrong type."""
    try:
        return kind.model_validate_json(body)
    except ValidationError as error:
        raise refusal(error.errors()[0]) from None


def refusal(error: dict) -> APIError:
    """pydantic's first error as one line."""
    if error["type"] == "json_invalid":
        return bad_request(f"the body is not valid JSON: {error['ctx']['error']}", "invalid_json")
    if error["type"] == "model_type" and not error["loc"]:
        return bad_request("the request body must be a JSON object", "invalid_type")
    field = field_name(error["loc"])
    if error["type"] == "missing":
        return bad_request(f"{field} is required", "missing_field", field)
    return bad_request(f"{field}: {error['msg'][:1].lower() + error['msg'][1:]}", "invalid_type", field)


def field_name(loc: tuple) -> str:
    """pydantic's location as the client wrote it: messages[0].content, without the union
    members pydantic tried (`str`, `list[...]`)."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part.isidentifier() and part not in UNION_MEMBERS:
            name += f".{part}" if name else part
    return name


UNION_MEMBERS = {"str", "int", "float", "bool", "list", "dict", "none"}


def check_chat_features(request: ChatRequest) -> None:
    for field in ("functions", "function_call"):
        if getattr(request, field) is not None:
            raise unsupported(f"{field} (the API's older form of tools: send tools and tool_choice) is", field)
    if request.top_logprobs is not None:
        if not request.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "invalid_value", "top_logprobs")
        if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {request.top_logprobs})",
                              "invalid_value", "top_logprobs")


def chat_messages(request: ChatRequest) -> list[dict]:
    """The messages as the chat template takes them ({"role", "content"}, text only)."""
    return [template_message(index, message) for index, message in enumerate(request.messages)]


def through_template(tokenizer: PreTrainedTokenizerBase, render: Callable[[], Rendered]) -> Rendered:
    """What `render` makes of a chat through the model's template; a 400 where the model has no
    template or its template refuses this conversation's shape."""
    if tokenizer.chat_template is None:
        raise bad_request("this model has no chat template, so it takes no chat: send its prompts to "
                          "/v1/completions", "unsupported_model", "model")
    try:
        return render()
    except TemplateError as error:
        raise bad_request(f"the model's chat template refuses these messages: {error}", "invalid_messages",
                          "messages") from None


def template_message(index: int, message: Message) -> dict:
    where = f"messages[{index}]"
    check_role(where, message.role)
    if message.role == "tool" and not message.tool_call_id:
        raise bad_request(f"{where}.tool_call_id is required: the id of the call this message answers",
                          "missing_field", f"{where}.tool_call_id")
    if message.tool_calls and message.role == "assistant":  # a call the model made: its text may be absent
        content = "" if message.content is None else text_of(where, message.content)
        return {"role": "assistant", "content": content, "tool_calls": template_calls(message.tool_calls, where)}
    answered = {"tool_call_id": message.tool_call_id} if message.role == "tool" else {}  # the call it answers
    return {"role": ROLES[message.role], "content": text_of(where, message.content)} | answered


def check_role(where: str, role: str) -> None:
    if role not in ROLES:
        raise bad_request(f"{where}.role: unknown role '{role}': use system, user, assistant or tool",
                          "invalid_value", f"{where}.role")


def text_of(where: str, content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        raise bad_request(f"{where}.content is required", "missing_field", f"{where}.content")
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        kind = part.get("type")
        if kind in ("image_url", "input_image", "input_audio", "file"):
            raise unsupported("images, audio and files are", f"{where}.content")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}.content: a content part must be {{\"type\": \"text\", \"text\": \"...\"}}",
                              "invalid_type", f"{where}.content")
        texts.append(part["text"])
    return "".join(texts)


def stop_strings(request: Decoded) -> list[str]:
    """The request's stop strings, any number of them: OpenAI takes 4, but vLLM and llama.cpp take
    any, and editors send more to servers other than OpenAI's (Continue's autocomplete 7-9)."""
    return nonempty_stops([request.stop] if isinstance(request.stop, str) else list(request.stop or []), "stop")


def nonempty_stops(stops: list[str], field: str) -> list[str]:
    """`stops`, the stop strings a request gives in `field`; a 400 where one is empty."""
    if any(not stop for stop in stops):
        raise bad_request(f"{field}: a stop string must not be empty", param=field)
    return stops


def token_limit(field: str, value: int) -> int:
    """`value`, the new tokens a request asks for in `field`; a 400 out of range."""
    if problem := MAX_TOKENS.problem(field, value):
        raise bad_request(problem, param=field)
    return value


def required_string(where: str, item: dict, key: str) -> str:
    """`item`'s `key`, which must be a string (`where`: the item's place in the request)."""
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key} is required: a string", "missing_field", f"{where}.{key}")
    return value


def sampling_of(request: Decoded, defaults: Defaults) -> SamplingParams:
    """The request's sampling, the server's defaults for what it leaves out; a 400 out of range."""
    given = {field: getattr(defaults, field) if getattr(request, field) is None else getattr(request, field)
             for field in SAMPLING_BOUNDS}
    for field, bounds in SAMPLING_BOUNDS.items():
        if problem := bounds.problem(field, given[field]):
            raise bad_request(problem, param=field)
    seed = request.seed if request.seed is not None else defaults.seed if defaults.seed is not None else fresh_seed()
    if not 0 <= seed < SEED_LIMIT:
        raise bad_request(f"seed must be >= 0 and below 2**63 (got {seed})", param="seed")
    return reply_sampling(given, seed)


def requested_tokens(request: ChatRequest) -> int | None:
    """max_completion_tokens, or the older max_tokens; None when neither is given."""
    for field in ("max_completion_tokens", "max_tokens"):
        if (value := getattr(request, field)) is not None:
            return token_limit(field, value)
    return None


def check_model(model: str, served: str) -> None:
    if model != served:
        raise APIError(404, f"model '{model}' is not served here: this server serves '{served}'",
                       "model_not_found", "model")


