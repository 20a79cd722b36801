"""A reply as OpenAI's Responses API objects: the response (its status, output items and usage), a
message item holding the reply's text (and its tokens' logprobs where asked), a function call item
a call; and, streamed, the events that build them, each numbered, as OpenAI's SDKs assemble them."""

import time
import uuid
from dataclasses import dataclass, field

from specchat.serve.reply import Reply, extension, usage
from specchat.serve.responses_request import ResponsesRequest
from specchat.serve.scheduler import Job


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str, logprobs: list[dict]) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(identifier: str, status: str, text: str | None = None, logprobs: list[dict] | None = None) -> dict:
    """The assistant's message: its one text part, none while it is being written (text None)."""
    content = [] if text is None else [text_part(text, logprobs or [])]
    return {"type": "message", "id": identifier, "status": status, "role": "assistant", "content": content}


def call_item(call: dict, status: str = "completed") -> dict:
    """A chat tool call (serve/structured.py's split_calls) as a function call item: `call_id` is
    what the function's output names when the conversation goes on."""
    return {"type": "function_call", "id": item_id("fc"), "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def response_usage(prompt_tokens: int, reply: Reply) -> dict:
    counts = usage(prompt_tokens, reply)
    return {"input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts.get("prompt_tokens_details", {}).get("cached_tokens", 0)},
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]}


def status_of(reply: Reply, called: bool) -> str:
    """completed, or incomplete where the reply ran out of tokens (max_output_tokens, or the context)."""
    return "incomplete" if reply.finish_reason(called) == "length" else "completed"


@dataclass(frozen=True)
class Shell:
    """What every object of one response repeats: its id, its time, and the request's settings."""

    model: str
    request: ResponsesRequest
    id: str = field(default_factory=lambda: item_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, job: Job, status: str, output: list[dict], reply: Reply | None = None) -> dict:
        """The response object; `reply` once it has ended (usage, and specchat's figures)."""
        request = self.request
        ended = {} if reply is None else {"usage": response_usage(len(job.prompt_ids), reply),
                                          "specchat": extension(job, reply)}
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
                "parallel_tool_calls": request.parallel_tool_calls is not False,
                "temperature": job.sampling.temperature, "top_p": job.sampling.top_p,
                "tool_choice": request.tool_choice or "auto", "tools": request.tools or [],
                "text": {"format": (request.text or {}).get("format") or {"type": "text"}},
                "top_logprobs": request.top_logprobs, "store": False, "usage": None} | ended


def whole_output(text: str, calls: list[dict], status: str, logprobs: list[dict]) -> list[dict]:
    """A reply's output items: its message (none where the reply is only calls), then its calls."""
    message = [message_item(item_id("msg"), status, text, logprobs)] if text or not calls else []
    return message + [call_item(call) for call in calls]


def logprob_entries(reply: Reply) -> list[dict]:
    """The logprobs of the tokens sent since the last call, as output_text's (none where not asked):
    the chat route's entries."""
    logged = reply.new_logprobs()
    return [] if logged is None else logged["content"]


@dataclass
class Events:
    """A streamed response's events, numbered in the order sent."""

    sequence: int = 0

    def event(self, kind: str, **fields: object) -> dict:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def call(self, index: int, item: dict) -> list[dict]:
        """A function call item, whole: added, its arguments in one delta, done."""
        place = {"item_id": item["id"], "output_index": index}
        return [self.event("response.output_item.added", output_index=index,
                           item=item | {"arguments": "", "status": "in_progress"}),
                self.event("response.function_call_arguments.delta", **place, delta=item["arguments"]),
                self.event("response.function_call_arguments.done", **place, name=item["name"],
                           arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]


@dataclass
class StreamedMessage:
    """The message item of a streamed reply: opened with its first text, or at the end where the
    reply has no calls (an empty reply is an empty message)."""

    events: Events
    id: str = field(default_factory=lambda: item_id("msg"))
    text: str = ""
    logprobs: list[dict] = field(default_factory=list)
    opened: bool = False
    index: int = 0  # its place in the output: first

    def delta(self, text: str, logprobs: list[dict]) -> list[dict]:
        opening = self.open()
        self.text, self.logprobs = self.text + text, self.logprobs + logprobs
        return opening + [self.events.event("response.output_text.delta", **self.place, delta=text,
                                            logprobs=logprobs)]

    def open(self) -> list[dict]:
        if self.opened:
            return []
        self.opened = True
        return [self.events.event("response.output_item.added", output_index=self.index,
                                  item=message_item(self.id, "in_progress")),
                self.events.event("response.content_part.added", **self.place, part=text_part("", []))]

    def close(self, status: str) -> list[dict]:
        opening = self.open()
        return opening + [
            self.events.event("response.output_text.done", **self.place, text=self.text, logprobs=self.logprobs),
            self.events.event("response.content_part.done", **self.place, part=text_part(self.text, self.logprobs)),
            self.events.event("response.output_item.done", output_index=self.index, item=self.item(status))]

    def item(self, status: str) -> dict:
        return message_item(self.id, status, self.text, self.logprobs)

    @property
    def place(self) -> dict:
        return {"item_id": self.id, "output_index": self.index, "content_index": 0}
