"""The server under load, bounded and on 127.0.0.1 only: 8 concurrent streaming clients x 3
requests each, all whole and in FIFO order; the queue's bound answers 429; a client that leaves
frees the engine within one iteration, and its place in the queue at once."""

import http.client
import json
import logging
import time
from dataclasses import dataclass, field

import openai
import pytest
from helpers.serve_helpers import MODEL, client, make_app, serving, user
from helpers.serve_load import figures, is_fifo, percentile, run_load

from specchat.decoding.events import SamplingParams
from specchat.tui.fake import REPLY, FakeEngine

WAIT_S = 30  # bound on every wait for the server's state: it only guards against a hang


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


@dataclass
class CountingEngine:
    """FakeEngine's reply, counting the iterations it has produced (across replies)."""

    inner: FakeEngine
    produced: int = 0
    prompts: list[list[int]] = field(default_factory=list)
    name: str = "specexec"
    keeps_forms: bool = True

    def live_settings(self):
        return self.inner.live_settings()

    def apply(self, settings):
        self.inner.apply(settings)

    def generate(self, prompt_ids, max_new_tokens, sampling: SamplingParams):
        self.prompts.append(list(prompt_ids))
        for event in self.inner.generate(prompt_ids, max_new_tokens, sampling):
            self.produced += 1
            yield event


def slow_engine(start: str = "") -> CountingEngine:
    """One token per iteration, a long reply (`start`, then x's): minutes unless cancelled."""
    return CountingEngine(FakeEngine(reply=start + "x" * 5000, accepted=(0,), delay_s=0.05))


def count_at_cancels(scheduler, engine: CountingEngine) -> list[int]:
    """A list that gets the engine's iteration count right after each withdrawal of the running
    request: from then on, only the iteration in progress may still be produced."""
    counts: list[int] = []
    withdraw = scheduler.withdraw

    def withdrawing(job) -> None:
        running = job is scheduler.running
        withdraw(job)
        if running:
            counts.append(engine.produced)

    scheduler.withdraw = withdrawing
    return counts


def test_eight_streaming_clients_three_requests_each_all_whole_and_fifo():
    app, scheduler = make_app([FakeEngine(delay_s=0.002)])
    with serving(app) as url:
        rows, wall_s = run_load(url, MODEL, ["one", "two", "three"], clients=8, requests=3, max_tokens=48)
    assert len(rows) == 24
    assert all(row.text == REPLY[:48] and row.finish_reason == "length" and row.completion_tokens == 48
               for row in rows)
    assert is_fifo(rows)
    assert sorted(row.started for row in rows) == list(range(1, 25))  # every request started, once
    # Concurrent clients did wait in the queue: one engine decodes one request at a time.
    assert max(row.queue_s for row in rows) > 0
    assert all(0 <= row.queue_s < row.wall_s for row in rows)  # the wait is part of what the client waited
    summary = figures(rows, wall_s)
    print(f"\nload: {summary['requests']} requests, {summary['tokens']} tokens in {wall_s:.2f} s, "
          f"{summary['tokens_per_s']:.0f} tokens/s, queue wait p50 {summary['queue_p50_s'] * 1000:.1f} ms, "
          f"p95 {summary['queue_p95_s'] * 1000:.1f} ms")


def test_percentile_is_the_nearest_rank():
    values = [float(v) for v in range(1, 21)]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 1.0)) == (10.0, 19.0, 20.0)


def open_stream(url: str, content: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streamed request over a raw connection, so the test can drop it mid-stream."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    body = {"model": MODEL, "messages": user(content), "stream": True}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return connection, connection.getresponse()


def read_content_chunks(response: http.client.HTTPResponse, count: int) -> list[str]:
    texts = []
    while len(texts) < count:
        line = response.fp.readline().decode()
        if line.startswith("data: ") and (delta := json.loads(line[6:])["choices"][0]["delta"]).get("content"):
            texts.append(delta["content"])
    return texts


def test_a_full_queue_answers_429_and_takes_requests_again_once_it_drains():
    engine = slow_engine()
    app, scheduler = make_app([engine], max_queue=2)
    with serving(app) as url:
        running, _ = open_stream(url, "a")
        wait_until(lambda: scheduler.running is not None, "the first request runs")
        waiting = [open_stream(url, content) for content in ("b", "c")]
        wait_until(lambda: len(scheduler.waiting) == 2, "two requests wait")
        with pytest.raises(openai.RateLimitError) as refused:
            client(url).chat.completions.create(model=MODEL, messages=user("d"))
        assert refused.value.status_code == 429 and refused.value.code == "queue_full"
        assert refused.value.type == "rate_limit_error"  # OpenAI's type: clients back off and retry on it
        assert refused.value.body["message"] == "the queue is full (2 requests waiting): retry later"
        # The waiting clients leave first, while "a" still runs: had "a" left first, the scheduler
        # could start "b" before the server saw "b" leave (it did once under load).
        for connection, _ in waiting:
            connection.close()
        wait_until(lambda: not scheduler.waiting, "the waiting requests are gone")
        running.close()
        wait_until(lambda: scheduler.running is None, "the running request is gone")
        engine.inner.reply = "done."
        reply = client(url).chat.completions.create(model=MODEL, messages=user("e"))
        assert reply.choices[0].message.content == "done."
    assert [prompt[-len("<assistant>") - len("</>") - 1] for prompt in engine.prompts] == [ord("a"), ord("e")]


def test_a_client_that_leaves_mid_stream_frees_the_engine_within_one_iteration():
    engine = slow_engine()
    app, scheduler = make_app([engine])
    produced_at_cancel = count_at_cancels(scheduler, engine)
    with serving(app) as url:
        connection, response = open_stream(url, "a")
        assert read_content_chunks(response, 3) == ["x", "x", "x"]
        connection.close()
        wait_until(lambda: scheduler.running is None, "the engine is free")
        assert len(produced_at_cancel) == 1, "the disconnect must cancel the running request"
        assert engine.produced - produced_at_cancel[0] <= 1  # at most the iteration in progress
        engine.inner.reply = "next."
        produced_before = engine.produced
        reply = client(url).chat.completions.create(model=MODEL, messages=user("b"))
        assert reply.choices[0].message.content == "next."
        # The engine ran the next request's 5 iterations and nothing of the cancelled one.
        assert engine.produced - produced_before == len("next.")


def test_a_reply_that_meets_its_stop_string_frees_the_engine_before_it_is_answered():
    """The client has what it wanted: its decode is withdrawn before the response is sent, not left
    to run the reply's thousands of tokens ahead of the next request."""
    engine = slow_engine("abcd")
    app, scheduler = make_app([engine])
    produced_at_cancel = count_at_cancels(scheduler, engine)
    with serving(app) as url:
        reply = client(url).chat.completions.create(model=MODEL, messages=user("a"), stop=["c"])
        assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == ("ab", "stop")
        assert len(produced_at_cancel) == 1  # withdrawn while it ran, before the answer left
        wait_until(lambda: scheduler.running is None, "the engine is free")
        assert engine.produced - produced_at_cancel[0] <= 1  # at most the iteration in progress


def test_a_client_that_leaves_while_queued_frees_its_place_and_never_runs():
    engine = slow_engine()
    app, scheduler = make_app([engine], max_queue=1)
    with serving(app) as url:
        running, _ = open_stream(url, "a")
        wait_until(lambda: scheduler.running is not None, "the first request runs")
        queued, _ = open_stream(url, "b")
        wait_until(lambda: len(scheduler.waiting) == 1, "the second request waits")
        queued.close()
        wait_until(lambda: not scheduler.waiting, "the queue is empty again")
        running.close()
        wait_until(lambda: scheduler.running is None, "the engine is free")
    assert len(engine.prompts) == 1  # "b" never reached the engine


def test_non_streaming_client_that_leaves_while_queued_is_released(caplog):
    caplog.set_level(logging.INFO, logger="specchat.serve")
    engine = slow_engine()
    app, scheduler = make_app([engine])
    with serving(app) as url:
        running, _ = open_stream(url, "a")
        wait_until(lambda: scheduler.running is not None, "the first request runs")
        queued = post(url, {"model": MODEL, "messages": user("b")})
        wait_until(lambda: len(scheduler.waiting) == 1, "the second request waits")
        queued.close()
        wait_until(lambda: not scheduler.waiting, "the queue is empty again")
        # Its handler ends (and logs its line) without waiting for the engine.
        wait_until(lambda: any(r.getMessage().startswith("POST /v1/chat/completions 200 tokens")
                               and "+0 " in r.getMessage() for r in caplog.records), "the request is logged")
        assert scheduler.running is not None and len(engine.prompts) == 1
        running.close()
        wait_until(lambda: scheduler.running is None, "the engine is free")


def post(url: str, body: dict) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return connection


def test_non_streaming_client_that_leaves_cancels_its_decode():
    engine = slow_engine()
    app, scheduler = make_app([engine])
    produced_at_cancel = count_at_cancels(scheduler, engine)
    with serving(app) as url:
        connection = post(url, {"model": MODEL, "messages": user("a")})
        wait_until(lambda: engine.produced >= 3, "decoding is under way")
        connection.close()
        wait_until(lambda: scheduler.running is None, "the engine is free")
        assert produced_at_cancel, "the disconnect must cancel the running request"
        assert engine.produced - produced_at_cancel[0] <= 1  # at most the iteration in progress
