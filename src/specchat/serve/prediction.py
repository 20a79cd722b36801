"""OpenAI's predicted outputs on chat completions: `prediction: {"type": "content", "content": ...}`,
text the reply is expected to repeat much of (an editor's file, to be changed in a few places).
SpecExec scores its tokens as a chain in each tree (decoding/prediction.py): the reply is the one
decoded without it, in fewer passes where it repeats the prediction. The usage reports the
predicted tokens the reply followed and those it did not, as OpenAI's does.

A chat request that predicts nothing (every chat route's) gets the code its last message quotes as
the prediction, as the chat does: an editor's "change this" with the file pasted in is answered
sooner where the reply repeats it, with the same reply. Its usage reports only what the client sent."""

from dataclasses import replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from specchat.decoding.events import SamplingParams
from specchat.decoding.prediction import quoted_prediction
from specchat.serve.errors import bad_request
from specchat.serve.schema import text_of


def predicted_tokens(prediction: dict[str, Any] | None, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...] | None:
    """The prediction's tokens, as the reply would hold its text (no special tokens added); None
    where there is none, or its text is empty. A 400 for another type of prediction."""
    if prediction is None:
        return None
    if prediction.get("type") != "content":
        raise bad_request(f"prediction.type must be 'content' (got {prediction.get('type')!r})", "invalid_value",
                          "prediction.type")
    tokens = tuple(tokenizer.encode(text_of("prediction", prediction.get("content")), add_special_tokens=False))
    return tokens or None


def prediction_usage(accepted: int, rejected: int) -> dict:
    """OpenAI's `completion_tokens_details` for a predicted output."""
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected}


def quoting(sampling: SamplingParams, messages: list[dict], tokenizer: PreTrainedTokenizerBase) -> SamplingParams:
    """`sampling` with the code the last message quotes as the reply's predicted output, where the
    request predicted nothing and the last message is the user's (a tool's result or an assistant's
    prefill is not a request to change code)."""
    if sampling.prediction is not None or not messages or messages[-1]["role"] != "user":
        return sampling
    return replace(sampling, prediction=quoted_prediction(messages[-1]["content"], tokenizer))
