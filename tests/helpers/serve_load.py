"""The load run: concurrent streaming clients, each sending requests one after another through
the `openai` package; every stream is checked whole, and the server's own figures (queue wait,
arrival and start order) are read from each reply's `specchat` object. Used by the load test
and by scripts/bench_serve.py."""

import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter

import openai


@dataclass(frozen=True)
class Row:
    client: int
    request: int
    text: str
    finish_reason: str
    completion_tokens: int
    queue_s: float
    arrived: int
    started: int
    wall_s: float  # request sent to last chunk, as the client saw it


def stream_once(chat: openai.OpenAI, model: str, messages: list[dict], max_tokens: int, client_id: int,
                request_id: int, **sampling: object) -> Row:
    """One streamed request; fails unless the stream is whole: a role first, content deltas, one
    finish reason with the `specchat` figures, then the usage chunk."""
    start = perf_counter()
    stream = chat.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, stream=True,
                                          stream_options={"include_usage": True}, **sampling)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant", "the stream does not open with the assistant's role"
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1, "a stream must end with exactly one finish reason"
    assert chunks[-1].usage is not None and not chunks[-1].choices, "the usage chunk must come last"
    figures = finishes[0].model_extra["specchat"]
    return Row(client=client_id, request=request_id,
               text="".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
               finish_reason=finishes[0].choices[0].finish_reason,
               completion_tokens=chunks[-1].usage.completion_tokens, queue_s=figures["queue_s"],
               arrived=figures["arrived"], started=figures["started"], wall_s=perf_counter() - start)


def run_load(base_url: str, model: str, prompts: list[str], clients: int, requests: int, max_tokens: int,
             api_key: str = "unused", **sampling: object) -> tuple[list[Row], float]:
    """`clients` threads at once, each sending `requests` streamed requests in turn (client c's
    request r asks prompts[(c * requests + r) % len(prompts)]); the rows and the wall time."""

    def one_client(client_id: int) -> list[Row]:
        chat = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=3600)
        return [stream_once(chat, model, [{"role": "user", "content": prompts[(client_id * requests + r) % len(prompts)]}],
                            max_tokens, client_id, r, **sampling) for r in range(requests)]

    start = perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        rows = [row for rows in pool.map(one_client, range(clients)) for row in rows]
    return rows, perf_counter() - start


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def figures(rows: list[Row], wall_s: float) -> dict:
    waits = [row.queue_s for row in rows]
    tokens = sum(row.completion_tokens for row in rows)
    return {"requests": len(rows), "tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s,
            "queue_p50_s": statistics.median(waits), "queue_p95_s": percentile(waits, 0.95),
            "latency_p50_s": statistics.median(row.wall_s for row in rows)}


def is_fifo(rows: list[Row]) -> bool:
    """Requests started in the order the server accepted them."""
    by_arrival = sorted(rows, key=lambda row: row.arrived)
    return [row.started for row in by_arrival] == sorted(row.started for row in rows)
