"""serve/penalty_fields.py on its own: the field a request's penalties are named by (where an engine
cannot keep them), the token ids a logit bias takes at the vocabulary's ends, a text's tokens without
special ones, and each field's refusal naming it."""

import pytest
from helpers.serve_helpers import MODEL, TINY_TOKENIZER, CharTokenizer, refusal, user

from specchat.serve.native_request import NativeRequest
from specchat.serve.penalty_fields import llama_bias, llama_penalties, openai_bias, openai_penalties
from specchat.serve.schema import ChatRequest, Defaults

OPENAI_FIELDS = {"logit_bias": {"5": 1.0}, "repetition_penalty": 1.2, "repeat_penalty": 1.2, "presence_penalty": 0.5,
                 "frequency_penalty": 0.5, "dry_multiplier": 0.8}
LLAMA_FIELDS = {"logit_bias": [[5, 1.0]], "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.5,
                "dry_multiplier": 0.8}


def chat(**fields) -> ChatRequest:
    return ChatRequest.model_validate({"model": MODEL, "messages": user("hi"), **fields})


@pytest.mark.parametrize("field", OPENAI_FIELDS)
def test_an_openai_request_is_named_by_the_penalty_it_sets(field):
    asked = openai_penalties(chat(**{field: OPENAI_FIELDS[field]}), TINY_TOKENIZER, Defaults())
    assert asked.field == field


@pytest.mark.parametrize("field", LLAMA_FIELDS)
def test_a_llama_cpp_request_is_named_by_the_penalty_it_sets(field):
    request = NativeRequest.model_validate({field: LLAMA_FIELDS[field]})
    asked = llama_penalties(request, TINY_TOKENIZER, Defaults(), request.logit_bias)
    assert asked.field == field


def test_the_servers_penalties_alone_are_named_by_its_first():
    """A request that sets nothing runs under `serve --presence-penalty`: named as repeat_penalty,
    the server's first penalty (its options say which to leave out)."""
    assert openai_penalties(chat(), TINY_TOKENIZER, Defaults(presence_penalty=0.5)).field == "repeat_penalty"


@pytest.mark.parametrize(("fields", "param"), [
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": 0.5, "frequency_penalty": -2.5}, "frequency_penalty"),
])
def test_an_openai_penalty_out_of_range_is_refused_naming_its_field(fields, param):
    status, message, named = refusal(openai_penalties, chat(**fields), TINY_TOKENIZER, Defaults())
    assert (status, named) == (400, param) and message.startswith(f"{param} must be")


@pytest.mark.parametrize(("fields", "param"), [
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
])
def test_a_llama_cpp_penalty_out_of_range_is_refused_naming_its_field(fields, param):
    status, message, named = refusal(llama_penalties, NativeRequest.model_validate(fields), TINY_TOKENIZER, Defaults())
    assert (status, named) == (400, param) and message.startswith(f"{param} must be")


def test_an_empty_dry_breaker_is_refused_naming_its_field():
    request = NativeRequest.model_validate({"dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", ""]})
    assert refusal(llama_penalties, request, TINY_TOKENIZER, Defaults()) == (
        400, "dry_sequence_breakers: a breaker must not be empty", "dry_sequence_breakers")


def test_a_bias_takes_the_vocabularys_first_and_last_ids_and_no_other():
    words = len(TINY_TOKENIZER)
    assert openai_bias({"0": 1.0, str(words - 1): -1.0}, words) == ((0, 1.0), (words - 1, -1.0))
    for outside in (words, -1):
        assert refusal(llama_bias, [[outside, 1.0]], TINY_TOKENIZER) == (
            400, f"logit_bias: token {outside} is not in the vocabulary (0-{words - 1})", "logit_bias")
    assert refusal(openai_bias, {"abc": 1.0}, words) == (400, "logit_bias: 'abc' is not a token id", "logit_bias")


def test_a_bias_out_of_range_is_refused_naming_its_entry():
    assert refusal(openai_bias, {"5": 101}, len(TINY_TOKENIZER)) == (
        400, "logit_bias['5'] must be between -100 and 100 (got 101.0)", "logit_bias")


class BosTokenizer(CharTokenizer):
    """A tokenizer that starts every text with its BOS token (0) unless asked not to, as Llama's does."""

    def encode(self, text: str, add_special_tokens: bool = True, **options) -> list[int]:
        return [0] * add_special_tokens + super().encode(text)


def test_a_texts_bias_goes_to_its_own_tokens_not_a_bos():
    assert llama_bias([["ab", 2.0]], BosTokenizer(vocab=128)) == ((ord("a"), 2.0), (ord("b"), 2.0))
