"""GET /metrics: Prometheus' text format, parsed as a scraper parses it; every figure is checked
against what the requests were answered (usage) and what the engine's events said."""

import urllib.error
import urllib.request
from collections import deque
from dataclasses import replace

import openai
import pytest
from helpers.serve_helpers import loop  # noqa: F401 (a fixture)
from helpers.serve_helpers import MODEL, client, make_app, post_json, serving, user
from prometheus_client.parser import text_string_to_metric_families

from specchat.decoding.events import IterationEvent, SamplingParams
from specchat.serve.metrics import ServeMetrics
from specchat.serve.scheduler import Job, Scheduler
from specchat.tui.fake import FakeEngine

def scrape(url: str, api_key: str | None = None) -> dict[tuple[str, tuple], float]:
    """Each sample by (name, sorted labels)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=headers)) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        return parsed(response.read().decode())


def parsed(text: str) -> dict[tuple[str, tuple], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def events_of(engine: FakeEngine) -> list[IterationEvent]:
    """The events of every call the server made: the fake engine is deterministic, so a copy
    replays what it decoded."""
    replay = replace(engine, calls=[], gate=None)
    return [event for prompt, wanted, sampling in engine.calls for event in replay.generate(prompt, wanted, sampling)]


def test_the_figures_are_the_sums_of_the_answers_and_of_the_engines_events():
    engine = FakeEngine()
    app, _ = make_app([engine])
    with serving(app) as url:
        api = client(url)
        chat = api.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=12)
        text = api.completions.create(model=MODEL, prompt="def f():", max_tokens=9)
        with pytest.raises(openai.BadRequestError):
            api.completions.create(model=MODEL, prompt="x", max_tokens=-1)
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{url}/v1/nowhere")
        figures = scrape(url)
    events = events_of(engine)
    assert len(engine.calls) == 2
    assert figures[("specchat_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))] == 1
    assert figures[("specchat_requests_total", (("route", "/v1/completions"), ("status", "200")))] == 1
    assert figures[("specchat_requests_total", (("route", "/v1/completions"), ("status", "400")))] == 1
    assert figures[("specchat_requests_total", (("route", "other"), ("status", "404")))] == 1
    usage = [chat.usage, text.usage]
    assert figures[("specchat_generation_tokens_total", ())] == sum(u.completion_tokens for u in usage) == 21
    assert figures[("specchat_prompt_tokens_total", ())] == sum(u.prompt_tokens for u in usage)
    assert figures[("specchat_prefill_tokens_total", ())] == sum(e.prefill_tokens for e in events) > 0
    assert figures[("specchat_iterations_total", ())] == len(events)
    assert figures[("specchat_draft_tokens_accepted_total", ())] == sum(e.accepted for e in events)
    assert figures[("specchat_draft_tokens_scored_total", ())] == sum(e.tree_size for e in events) > 0
    assert figures[("specchat_draft_seconds_total", ())] == pytest.approx(sum(e.draft_s for e in events))
    assert figures[("specchat_time_to_first_token_seconds_count", ())] == 2
    assert figures[("specchat_queue_wait_seconds_count", ())] == 2
    assert figures[("specchat_request_duration_seconds_count", (("route", "/v1/completions"),))] == 2
    # each request's wait ends before its first token, which comes before the route answers
    durations = sum(value for (name, _), value in figures.items() if name == "specchat_request_duration_seconds_sum")
    assert 0 <= figures[("specchat_queue_wait_seconds_sum", ())] <= figures[
        ("specchat_time_to_first_token_seconds_sum", ())] <= durations
    assert figures[("specchat_model_info", (("engine", "specexec"), ("model", MODEL)))] == 1
    assert (figures[("specchat_requests_waiting", ())], figures[("specchat_requests_running", ())]) == (0, 0)


def test_the_queue_gauges_read_the_scheduler_at_each_scrape():
    """Set by hand on a scheduler that never starts: a request decoding and one waiting, then none."""
    scheduler = Scheduler([FakeEngine()], max_queue=4)
    metrics = ServeMetrics(MODEL, "specexec", scheduler, frozenset())
    scheduler.running, scheduler.waiting = "decoding", deque(["waiting"])
    busy = parsed(metrics.exposition().decode())
    scheduler.running, scheduler.waiting = None, deque()
    idle = parsed(metrics.exposition().decode())
    gauges = [("specchat_requests_running", ()), ("specchat_requests_waiting", ())]
    assert [busy[g] for g in gauges] == [1, 1] and [idle[g] for g in gauges] == [0, 0]


class FirstTokenTimes:
    """An observer that notes a job's first-token time at each of its events."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_start(self, job: Job) -> None:
        pass

    def on_event(self, job: Job, event: IterationEvent) -> None:
        self.seen.append(job.first_token_s)

    def on_end(self, job: Job) -> None:
        pass


def test_a_jobs_first_token_time_is_set_at_its_first_tokens_and_kept(loop):
    """Time to first token is observed from `first_token_s`: the first event with tokens sets it,
    the later ones leave it."""
    scheduler, watch = Scheduler([FakeEngine()], max_queue=1), FirstTokenTimes()
    scheduler.observers.append(watch)
    scheduler.run(Job([104, 105], 12, SamplingParams(0.0, 1.0), loop))
    assert len(watch.seen) > 1 and watch.seen[0] > 0 and set(watch.seen) == {watch.seen[0]}


def test_an_api_key_guards_the_metrics():
    app, _ = make_app([FakeEngine()], api_key="sesame")
    with serving(app) as url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(url)
        assert refused.value.code == 401
        assert scrape(url, api_key="sesame")[("specchat_iterations_total", ())] == 0


def test_streamed_weight_bytes_add_up_from_the_events():
    """The offload figures come from the events' fields, not from the token counts."""
    engine = FakeEngine()
    engine.transfer_bytes = 3000
    app, _ = make_app([engine])
    with serving(app) as url:
        client(url).chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=6)
        figures = scrape(url)
    events = events_of(engine)
    assert figures[("specchat_weight_bytes_streamed_total", ())] == 3000 * len(events) > 0


def test_a_warm_up_counts_its_prompt_and_its_streaming_but_no_token_iteration_or_first_token():
    """llama.vim's `n_predict: 0` computes the prompt and a token nobody is sent: beside one real
    request, the warm-up adds to prompt, prefill and streaming alone."""
    engine = FakeEngine()
    engine.transfer_bytes = 3000
    app, _ = make_app([engine])
    with serving(app) as url:
        post_json(f"{url}/completion", {"prompt": "warm me", "n_predict": 0, "cache_prompt": True})
        chat = client(url).chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=6)
        figures = scrape(url)
    warm_events, chat_events = (events_of(replace(engine, calls=[call])) for call in engine.calls)
    assert len(warm_events) == 1 and engine.calls[0][1] == 1  # the warm-up's one pass and token
    assert figures[("specchat_generation_tokens_total", ())] == chat.usage.completion_tokens == 6
    assert figures[("specchat_iterations_total", ())] == len(chat_events)
    assert figures[("specchat_draft_tokens_scored_total", ())] == sum(e.tree_size for e in chat_events)
    assert figures[("specchat_time_to_first_token_seconds_count", ())] == 1
    assert figures[("specchat_prompt_tokens_total", ())] == len(engine.calls[0][0]) + chat.usage.prompt_tokens
    assert figures[("specchat_prefill_tokens_total", ())] == sum(e.prefill_tokens for e in warm_events + chat_events)
    assert figures[("specchat_weight_bytes_streamed_total", ())] == 3000 * (len(chat_events) + 1)
    assert figures[("specchat_queue_wait_seconds_count", ())] == 2
