"""The logit bias and repetition penalties a request asks for, in its API's fields and windows
(decoding/penalties.py applies them):
- the OpenAI routes: `presence_penalty` and `frequency_penalty` count the reply's tokens (OpenAI's
  definition), vLLM's `repetition_penalty` the prompt's and the reply's (or llama-server's
  `repeat_penalty`, over its `repeat_last_n` window of them); `logit_bias` maps token ids (as
  strings) to a bias in [-100, 100];
- llama.cpp's routes and Ollama's options: `repeat_penalty`, `presence_penalty` and
  `frequency_penalty` all count the last `repeat_last_n` tokens of the prompt and the reply (64 left
  out, -1 all, 0 none), as llama.cpp's sampler does; llama.cpp's `logit_bias` also takes
  [[id or text, bias or false], ...] (a text's tokens each get the bias; false: never sampled).
A field left out takes the server's (`serve --repeat-penalty`, `--repeat-last-n`, `--presence-penalty`,
`--frequency-penalty`, as llama-server's options, over its window of the prompt and the reply; by
default no penalty, where Ollama's llama.cpp runner would apply repeat_penalty 1.1); on the OpenAI
routes a request that sets presence_penalty or frequency_penalty sets both (its window is OpenAI's)."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from specchat.decoding.dry import DEFAULT_BREAKERS, Dry, dry_of
from specchat.decoding.penalties import Penalties, Window
from specchat.limits import DRY_BOUNDS, LOGIT_BIAS, PRESENCE_OR_FREQUENCY, REPEAT_LAST_N, REPEAT_PENALTY, Bounds
from specchat.serve.errors import bad_request
from specchat.serve.schema import Defaults


@dataclass(frozen=True)
class Asked:
    """Penalties a request sets, and the first field that set one (named where an engine cannot keep them)."""

    penalties: Penalties
    field: str


def openai_penalties(request: Any, tokenizer: PreTrainedTokenizerBase, server: Defaults) -> Asked | None:
    """OpenAI's penalties and logit bias, and a repetition penalty: vLLM's `repetition_penalty`
    over the prompt and the reply, or llama-server's `repeat_penalty` over its `repeat_last_n`
    window of them; the server's where the request sets none; None when none is set."""
    if request.repetition_penalty is not None and request.repeat_penalty is not None:
        raise bad_request("repetition_penalty (vLLM's) and repeat_penalty (llama.cpp's) name one penalty: give one",
                          param="repeat_penalty")
    if request.repetition_penalty is not None:  # vLLM's
        repeat, window = checked("repetition_penalty", REPEAT_PENALTY, request.repetition_penalty, 1.0), Window()
    else:
        repeat = checked("repeat_penalty", REPEAT_PENALTY, request.repeat_penalty, server.repeat_penalty)
        window = llama_window(request, server)
    if request.presence_penalty is None and request.frequency_penalty is None:  # the server's, in its window
        presence, frequency, counted = server.presence_penalty, server.frequency_penalty, llama_window(request, server)
    else:
        presence = checked("presence_penalty", PRESENCE_OR_FREQUENCY, request.presence_penalty, 0.0)
        frequency = checked("frequency_penalty", PRESENCE_OR_FREQUENCY, request.frequency_penalty, 0.0)
        counted = Window(prompt=False)
    penalties = Penalties(bias=openai_bias(request.logit_bias, len(tokenizer)), repeat=repeat, repeat_window=window,
                          presence=presence, frequency=frequency, count_window=counted,
                          dry=requested_dry(request, tokenizer, server))
    return asked(penalties, request, ("logit_bias", "repetition_penalty", "repeat_penalty", "presence_penalty",
                                      "frequency_penalty", "dry_multiplier"))


def llama_penalties(request: Any, tokenizer: PreTrainedTokenizerBase, server: Defaults,
                    bias: Any = None) -> Asked | None:
    """llama.cpp's (and Ollama's) penalties over one window, and llama.cpp's `bias`; the server's
    where the request sets none; None when none is set."""
    window = llama_window(request, server)
    penalties = Penalties(
        bias=llama_bias(bias, tokenizer),
        repeat=checked("repeat_penalty", REPEAT_PENALTY, request.repeat_penalty, server.repeat_penalty),
        presence=checked("presence_penalty", PRESENCE_OR_FREQUENCY, request.presence_penalty, server.presence_penalty),
        frequency=checked("frequency_penalty", PRESENCE_OR_FREQUENCY, request.frequency_penalty,
                          server.frequency_penalty),
        repeat_window=window, count_window=window, dry=requested_dry(request, tokenizer, server))
    return asked(penalties, request, ("logit_bias", "repeat_penalty", "presence_penalty", "frequency_penalty",
                                      "dry_multiplier"))


def requested_dry(request: Any, tokenizer: PreTrainedTokenizerBase, server: Defaults) -> Dry | None:
    """llama.cpp's DRY, each field the server's where left out; its breakers the request's
    `dry_sequence_breakers` (left out: llama.cpp's); None where it is off."""
    given = {field: checked(field, bounds, getattr(request, field), getattr(server, field))
             for field, bounds in DRY_BOUNDS.items()}
    breakers = request.dry_sequence_breakers
    if breakers is not None and not all(breakers):
        raise bad_request("dry_sequence_breakers: a breaker must not be empty", param="dry_sequence_breakers")
    return dry_of(given["dry_multiplier"], given["dry_base"], int(given["dry_allowed_length"]),
                  int(given["dry_penalty_last_n"]), tokenizer, DEFAULT_BREAKERS if breakers is None else breakers)


def llama_window(request: Any, server: Defaults) -> Window:
    """The last `repeat_last_n` tokens of the prompt and the reply (the server's left out, -1 all)."""
    return Window(last=int(checked("repeat_last_n", REPEAT_LAST_N, request.repeat_last_n, server.repeat_last_n)))


def asked(penalties: Penalties, request: Any, fields: tuple[str, ...]) -> Asked | None:
    """`penalties` and the first of `fields` the request set (none: the server's own, named as its
    first penalty); None where they change nothing."""
    if not penalties.active:
        return None
    return Asked(penalties, next((field for field in fields if getattr(request, field, None) is not None),
                                 "repeat_penalty"))


def checked(field: str, bounds: Bounds, value: float | None, default: float) -> float:
    """`value`, or `default` where it is left out; a 400 naming `field` out of `bounds`."""
    if value is None:
        return default
    if problem := bounds.problem(field, value):
        raise bad_request(problem, param="logit_bias" if field.startswith("logit_bias") else field)
    return value


def openai_bias(value: Any, words: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias}; a 400 for anything else."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request("logit_bias must be an object of token ids to biases", param="logit_bias")
    return summed((token_id(key, words), bias_value(key, bias)) for key, bias in value.items())


def llama_bias(value: Any, tokenizer: PreTrainedTokenizerBase) -> tuple[tuple[int, float], ...]:
    """llama.cpp's logit_bias: {"id or text": bias} or [[id or text, bias or false], ...]."""
    if value is None:
        return ()
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in value):
        pairs = [tuple(pair) for pair in value]
    else:
        raise bad_request("logit_bias must be an object or a list of [token, bias] pairs", param="logit_bias")
    return summed((token, bias_value(key, bias)) for key, bias in pairs for token in llama_tokens(key, tokenizer))


def llama_tokens(key: Any, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """A bias's tokens: an id (a number, or a string of one), or a text's tokens."""
    if isinstance(key, str) and not key.isdigit():
        return tokenizer.encode(key, add_special_tokens=False)
    return [token_id(key, len(tokenizer))]


def token_id(key: Any, words: int) -> int:
    if isinstance(key, bool) or not isinstance(key, (int, str)) or (isinstance(key, str) and not key.isdigit()):
        raise bad_request(f"logit_bias: {key!r} is not a token id", param="logit_bias")
    if not 0 <= int(key) < words:
        raise bad_request(f"logit_bias: token {key} is not in the vocabulary (0-{words - 1})", param="logit_bias")
    return int(key)


def bias_value(key: Any, bias: Any) -> float:
    """A number in [-100, 100], or false (llama.cpp's: never sampled)."""
    if bias is False:
        return -float("inf")
    if isinstance(bias, bool) or not isinstance(bias, (int, float)):
        raise bad_request(f"logit_bias: the bias of {key!r} must be a number", param="logit_bias")
    return checked(f"logit_bias[{key!r}]", LOGIT_BIAS, float(bias), 0.0)


def summed(pairs: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """One bias a token, its entries added (as llama.cpp's sampler adds each)."""
    total: dict[int, float] = {}
    for token, bias in pairs:
        total[token] = total.get(token, 0.0) + bias
    return tuple(total.items())
