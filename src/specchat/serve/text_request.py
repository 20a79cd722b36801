"""The text-completion request (OpenAI's /v1/completions): a prompt, as text or token ids, or a
batch of them, and an optional `suffix` to fill in the middle before; its checks, each refusal one line."""

from typing import Any, ClassVar

from transformers import PreTrainedTokenizerBase

from specchat.serve.choices import candidate_count
from specchat.serve.errors import bad_request, unsupported
from specchat.serve.fim import FimTokens
from specchat.serve.schema import MAX_TOP_LOGPROBS, Decoded, token_limit

DEFAULT_MAX_TOKENS = 16  # as OpenAI's API: a completion is short unless asked


class TextRequest(Decoded):
    CHOICES: ClassVar[bool] = True
    prompt: str | list[int] | list[str] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = None
    echo: bool | None = None  # null as false, as the openai client may send it
    logprobs: int | None = None
    best_of: int | None = None
    response_format: dict[str, Any] | None = None


def check_text_features(request: TextRequest) -> None:
    if request.logprobs is not None:
        if not 0 <= request.logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {request.logprobs})",
                              "invalid_value", "logprobs")
        if request.echo and request.suffix:
            raise unsupported("echo with logprobs and a suffix (the prompt's logprobs are of a raw prompt's tokens) "
                              "is", "echo")


def candidates_of(request: TextRequest, n: int) -> int:
    """The candidates decoded a prompt, of which `n` are returned: `best_of`, `n` where it is left
    out. More than `n` cannot be streamed (as OpenAI's API says): the best are known only once every
    candidate has ended."""
    count = candidate_count(request.best_of, n)
    if request.stream and count > n:
        raise bad_request(f"best_of = {count} above n = {n} cannot be streamed: the best are known only once every "
                          "candidate has ended", "invalid_value", "stream")
    return count


def completion_tokens(request: TextRequest) -> int:
    if request.max_tokens is None:
        return DEFAULT_MAX_TOKENS
    return token_limit("max_tokens", request.max_tokens)


def prompts_of(request: TextRequest) -> list[str | list[int]]:
    """The prompts, each a string or token ids: one, or a batch, answered as a choice each, in order."""
    return as_batch(request.prompt)


def as_batch(given: str | list) -> list:
    """A prompt field's items, as OpenAI's routes read it: a string or one token array is one item,
    a list of either each of its own."""
    return list(given) if isinstance(given, list) and given and not isinstance(given[0], int) else [given]


def prompt_ids(prompt: str | list[int], suffix: str | None, tokenizer: PreTrainedTokenizerBase,
               fim: FimTokens | None) -> list[int]:
    """The prompt's token ids: a string as the tokenizer encodes it (its special tokens' names read
    as those tokens, as raw prompts are), around `suffix` in the model's fill-in-the-middle format."""
    if suffix and fim is None:
        raise bad_request("suffix: this model has no fill-in-the-middle tokens, so it cannot complete before a "
                          "suffix", "unsupported_parameter", "suffix")
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(fim.prompt(prompt, suffix) if suffix else prompt))
    elif suffix:
        raise bad_request("suffix needs a text prompt, not token ids", "invalid_value", "suffix")
    else:
        ids = checked_ids(prompt, len(tokenizer))
    if not ids:
        raise bad_request("the prompt is empty after tokenization", param="prompt")
    return ids


def checked_ids(ids: list[int], vocab: int, param: str = "prompt") -> list[int]:
    if outside := [token for token in ids if not 0 <= token < vocab]:
        raise bad_request(f"{param}: token id {outside[0]} is outside the vocabulary [0, {vocab})", param=param)
    return ids
