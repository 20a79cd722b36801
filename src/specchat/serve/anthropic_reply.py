"""A reply as Anthropic's Messages API objects: the message (its content blocks, why it stopped, its
usage), and, streamed, the events that build it (message_start, each block's start, deltas and
stop, message_delta, message_stop); a refusal in Anthropic's error shape."""

import json
import uuid
from dataclasses import dataclass

from specchat.serve.errors import APIError
from specchat.serve.reply import Reply, extension, usage
from specchat.serve.scheduler import Job

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error"}  # any other status: api_error


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use(call: dict) -> dict:
    """A chat tool call (serve/structured.py's split_calls) as a tool_use block: its id is what the
    tool_result answering it names."""
    return {"type": "tool_use", "id": f"toolu_{call['id'].removeprefix('call_')}", "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def stop_reason(reply: Reply, called: bool) -> str:
    if called:
        return "tool_use"
    if reply.stopped:
        return "stop_sequence"
    return "end_turn" if reply.ended_by_model else "max_tokens"


def token_usage(job: Job, reply: Reply | None) -> dict:
    """Tokens in and out, Anthropic's way: input_tokens counts the prompt tokens decoded anew, those
    the engine reused from its caches are cache_read_input_tokens."""
    counts = usage(len(job.prompt_ids), reply) if reply is not None else {"prompt_tokens": len(job.prompt_ids),
                                                                          "completion_tokens": 0}
    cached = counts.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {"input_tokens": counts["prompt_tokens"] - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": counts["completion_tokens"]}


def message(model: str, identifier: str, content: list[dict], job: Job, reply: Reply | None = None,
            called: bool = False) -> dict:
    """The message object; `reply` once it has ended (why it stopped, and specchat's figures)."""
    ended = {} if reply is None else {"specchat": extension(job, reply)}
    return {"id": identifier, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": None if reply is None else stop_reason(reply, called),
            "stop_sequence": reply.scan.word if reply is not None and reply.stopped else None,
            "usage": token_usage(job, reply)} | ended


def whole_content(text: str, calls: list[dict]) -> list[dict]:
    """A reply's blocks: its text (none where the reply is only calls), then its calls."""
    return ([{"type": "text", "text": text}] if text or not calls else []) + [tool_use(call) for call in calls]


def error_body(error: APIError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def frame(event: dict) -> str:
    """An event on the wire: named by its type, as Anthropic's stream names them."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


@dataclass
class StreamedBlocks:
    """The content blocks of a streamed reply, numbered as they open: the text block with the
    first text (or at the end where the reply has no calls), then each call whole."""

    opened: int = 0
    text_open: bool = False

    def text(self, text: str) -> list[dict]:
        opening = [] if self.text_open else [self.start({"type": "text", "text": ""})]
        self.text_open = True
        return opening + [{"type": "content_block_delta", "index": self.opened - 1,
                           "delta": {"type": "text_delta", "text": text}}]

    def close_text(self, has_calls: bool) -> list[dict]:
        """The text block's stop (an empty one opened first where the reply is nothing at all)."""
        if not self.text_open and has_calls:
            return []
        opening = [] if self.text_open else [self.start({"type": "text", "text": ""})]
        return opening + [{"type": "content_block_stop", "index": self.opened - 1}]

    def call(self, block: dict) -> list[dict]:
        """A tool_use block: started with empty input, its input in one JSON delta, stopped."""
        started = self.start(block | {"input": {}})
        return [started, {"type": "content_block_delta", "index": started["index"],
                          "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}},
                {"type": "content_block_stop", "index": started["index"]}]

    def start(self, block: dict) -> dict:
        self.opened += 1
        return {"type": "content_block_start", "index": self.opened - 1, "content_block": block}
