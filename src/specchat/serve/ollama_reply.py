"""Ollama's reply objects: a streamed piece (`message` for /api/chat, `response` for /api/generate)
with `done: false`, then the last with `done: true`, why it ended and Ollama's counts and
durations (nanoseconds); a tool call with its arguments as an object; a refusal as {"error"}."""

import json
from datetime import datetime, timezone

from specchat.serve.errors import APIError
from specchat.serve.native_reply import timings
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job

NS_PER_MS = 1_000_000


def created_at() -> str:
    """The time now as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def piece(model: str, field: str, value: object, reply: Reply) -> dict:
    """A streamed piece: `field` ("message" or "response") holding `value`, with the logprobs of
    the tokens logged since the last piece when they were asked for."""
    return {"model": model, "created_at": created_at(), field: value, "done": False} | logprobs(reply)


def last(model: str, field: str, value: object, job: Job, reply: Reply) -> dict:
    """The reply's last object: `value` (streamed: what was held back to the end), how it ended
    (stop: the model's end or a stop string; length: the token limit) and what it took."""
    figures = timings(job, reply)
    return {"model": model, "created_at": created_at(), field: value, "done": True,
            "done_reason": reply.finish_reason(),
            "total_duration": round((figures["prompt_ms"] + figures["predicted_ms"]) * NS_PER_MS),
            "load_duration": 0,  # the model was loaded when the server started
            "prompt_eval_count": figures["prompt_n"], "prompt_eval_duration": round(figures["prompt_ms"] * NS_PER_MS),
            "eval_count": figures["predicted_n"], "eval_duration": round(figures["predicted_ms"] * NS_PER_MS),
            } | logprobs(reply)


def loaded(model: str, field: str, value: object) -> dict:
    """The answer to a request with nothing to decode: Ollama's "the model is loaded"."""
    return {"model": model, "created_at": created_at(), field: value, "done": True, "done_reason": "load"}


def logprobs(reply: Reply) -> dict:
    """Ollama's `logprobs`: OpenAI's entries (token, logprob, bytes, top_logprobs) of the tokens
    logged since the last call; nothing where they were not asked for."""
    logged = reply.new_logprobs()
    return {} if logged is None else {"logprobs": logged["content"]}


def assistant(content: str, calls: list[dict]) -> dict:
    """A message of the reply; its tool calls (OpenAI's, from split_calls) as Ollama gives them."""
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"function": {"index": index, "name": call["function"]["name"],
                                               "arguments": json.loads(call["function"]["arguments"])}}
                                 for index, call in enumerate(calls)]
    return message


def error_body(error: APIError) -> dict:
    """A refusal as Ollama answers one: {"error": message}."""
    return {"error": error.message}


def ndjson(chunk: dict) -> str:
    """A streamed object on the wire: one line of JSON."""
    return json.dumps(chunk, ensure_ascii=False) + "\n"
