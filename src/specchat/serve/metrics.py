"""`GET /metrics`: what the server has done, in Prometheus' text format, for a scraper or a glance
with curl: requests by route and status, tokens in and out, and what speculation does for them
(draft tokens the target scored and accepted, iterations, seconds drafting and verifying, weight
bytes streamed), with time to first token and queue waits as histograms.

Tokens per iteration is generation_tokens / iterations (tokens decoded: a reply a stop string
ends sends fewer, the decoder's work is what these count); the share of the scored draft tokens
accepted is draft_tokens_accepted / draft_tokens_scored; the prompt cache's reuse is
1 - prefill_tokens / prompt_tokens.

A warm-up (llama.cpp's `n_predict: 0`, which llama.vim sends every second or so) computes its
prompt and one token it never sends: its prompt, prefill, weight streaming and queue wait are work
done and count; its token, iteration and first token were decoded for nobody and do not (they
lowered tokens per iteration and filled the first-token histogram with warm-ups' times).
"""

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info,
                               disable_created_metrics, generate_latest)

from specchat.decoding.events import IterationEvent
from specchat.serve.scheduler import Job, Scheduler

disable_created_metrics()  # no `_created` series beside each counter: nothing here reads them
CONTENT_TYPE = CONTENT_TYPE_LATEST
OTHER_ROUTE = "other"  # a path no route names as is (a 404, a model's card): one label, however many are asked
# From a 1-token reply on a GPU to a long one on two CPU cores.
SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
# (name, help, the IterationEvent field it sums; None: its tokens)
EVENT_SUMS = (
    ("generation_tokens", "Tokens decoded (those a stop string then cut from a reply included)", None),
    ("draft_tokens_accepted", "Draft tokens the target accepted", "accepted"),
    ("draft_tokens_scored", "Draft tokens the target scored in its tree passes", "tree_size"),
    ("draft_steps", "Draft model forwards spent growing trees", "draft_steps"),
    ("draft_seconds", "Seconds spent drafting", "draft_s"),
    ("target_seconds", "Seconds the target spent scoring and verifying", "target_s"),
    ("prefill_tokens", "Prompt tokens computed (past the prefix the caches reused)", "prefill_tokens"),
    ("prefill_seconds", "Seconds spent computing prompts", "prefill_s"),
    ("weight_bytes_streamed", "Target weight bytes streamed to the device (offload)", "transfer_bytes"),
    ("weight_stall_seconds", "Seconds the target's compute waited for streamed weights", "stall_s"),
)
WARM_SUMS = frozenset({"prefill_tokens", "prefill_s", "transfer_bytes", "stall_s"})  # what a warm-up's event adds


class ServeMetrics:
    """The server's figures, on a registry of its own (one per app); the scheduler's thread adds
    its jobs' events (Scheduler.observers), the request log its answers (logs.RequestLog)."""

    def __init__(self, model: str, engine: str, scheduler: Scheduler, routes: frozenset[str]) -> None:
        self.routes = routes  # the app's paths, each its own label
        self.registry = CollectorRegistry(auto_describe=False)
        Info("specchat_model", "The model served and its decoding engine", registry=self.registry).info(
            {"model": model, "engine": engine})
        self.requests = Counter("specchat_requests", "HTTP requests answered", ["route", "status"],
                                registry=self.registry)
        self.request_seconds = Histogram("specchat_request_duration_seconds", "Seconds from a request to its last byte",
                                         ["route"], buckets=SECONDS, registry=self.registry)
        self.first_token = Histogram("specchat_time_to_first_token_seconds",
                                     "Seconds from a request's arrival in the queue to its first token",
                                     buckets=SECONDS, registry=self.registry)
        self.queue_wait = Histogram("specchat_queue_wait_seconds", "Seconds a request waited for the decoder",
                                    buckets=SECONDS, registry=self.registry)
        self.prompt_tokens = Counter("specchat_prompt_tokens", "Prompt tokens of the requests decoded",
                                     registry=self.registry)
        self.iterations = Counter("specchat_iterations", "Decoding iterations (each one target pass)",
                                  registry=self.registry)
        self.sums = {field: Counter(f"specchat_{name}", text, registry=self.registry)
                     for name, text, field in EVENT_SUMS}
        Gauge("specchat_requests_waiting", "Requests in the queue", registry=self.registry).set_function(
            lambda: len(scheduler.waiting))
        Gauge("specchat_requests_running", "Requests decoding now", registry=self.registry).set_function(
            lambda: int(scheduler.running is not None))
        scheduler.observers.append(self)

    def on_start(self, job: Job) -> None:
        self.prompt_tokens.inc(len(job.prompt_ids))
        self.queue_wait.observe(job.queue_s)

    def on_event(self, job: Job, event: IterationEvent) -> None:
        """From the decoding thread (prometheus_client's metrics take increments from any thread)."""
        if not job.warm:
            self.iterations.inc()
        for field, counter in self.sums.items():
            if not job.warm or field in WARM_SUMS:
                counter.inc(len(event.token_ids) if field is None else getattr(event, field))

    def on_end(self, job: Job) -> None:
        if job.first_token_s and not job.warm:
            self.first_token.observe(job.first_token_s - job.enqueued_s)

    def on_answer(self, path: str, status: int, seconds: float) -> None:
        route = path if path in self.routes else OTHER_ROUTE
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
