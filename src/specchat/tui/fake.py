"""A deterministic stand-in for the models: the app's tests and `--fake` dev mode run on it.

The tokenizer maps each character to one token (its code point), the engine "decodes" a fixed
reply in chunks of accepted+1 tokens per iteration, reading its budget live as SpecExec does;
FakeDSIEngine does the same as dsi, with verification jobs, a lookahead and a worker notice.
A test can hold either engine before each iteration with a `Gate`, to act mid-reply however slow
the machine is.
"""

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import cycle
from time import sleep

from specchat.decoding.dry import Restarts
from specchat.decoding.events import AUTO, IterationEvent, LiveSettings, SamplingParams
from specchat.decoding.prediction import Prediction, quoted_prediction
from specchat.errors import SpecchatError
from specchat.textstream import TextStream
from specchat.tui.backend import settings_for
from specchat.tui.settings import DecodingSettings

REPLY = (
    "Here is a **short** answer.\n\n"
    "```python\ndef greet(name):\n    return f\"hello {name}\"\n```\n\n"
    "Call `greet` with a name."
)
ACCEPTED = (3, 1, 4, 0, 2, 5)  # draft tokens accepted per iteration, cycled
AUTO_SIZE = 40  # the tree size a fake engine sizing its own trees reports
PREFILL_S = 0.015  # the prefill time a fake engine reports
WORKER_NOTICE = "dsi: 2 workers, fewer than the 3 that keep up with this drafter; verification jobs will queue"
GATE_HANG_S = 60.0  # an iteration held this long fails: a test that never lets it go ends, not hangs


class Gate:
    """Holds a fake engine before each iteration until a test lets it through: the test, not
    the machine's speed, decides how far a reply has got when it presses a key."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.allowed = 0  # iterations the test has let through
        self.passed = 0  # iterations that have gone through
        self.opened = False  # every iteration goes through from now on

    def allow(self, iterations: int = 1) -> None:
        with self.condition:
            self.allowed += iterations
            self.condition.notify_all()

    def open(self) -> None:
        with self.condition:
            self.opened = True
            self.condition.notify_all()

    def enter(self) -> None:
        """The engine's call before each iteration: returns once the iteration may run."""
        with self.condition:
            if not self.condition.wait_for(lambda: self.opened or self.passed < self.allowed, GATE_HANG_S):
                raise TimeoutError(f"iteration {self.passed + 1} was held {GATE_HANG_S:.0f} s: nothing let it through")
            self.passed += 1


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(char) for char in text]  # no special tokens: there are none

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(token) for token in token_ids)


def fake_chunks(engine: "FakeEngine | FakeDSIEngine", prompt_ids: list[int], max_new_tokens: int,
                sampling: SamplingParams) -> Iterator[tuple[list[int], bool]]:
    """The engine's reply in chunks of accepted + 1 tokens, each with whether it is the last."""
    engine.calls.append((list(prompt_ids), max_new_tokens, sampling))
    reply = FakeTokenizer().encode(engine.reply)[:max_new_tokens]
    produced, accepted = 0, cycle(engine.accepted)
    while produced < len(reply):
        if engine.gate is not None:
            engine.gate.enter()
        sleep(engine.delay_s)
        chunk = reply[produced:produced + next(accepted) + 1]
        produced += len(chunk)
        yield chunk, produced == len(reply)


def fixed_event(chunk: list[int], finished: bool, tree_size: int, depth: int, transfer_bytes: int = 0) -> IterationEvent:
    # Fixed costs, so that every figure derived from them is reproducible in snapshots.
    return IterationEvent(
        token_ids=chunk, accepted=len(chunk) - 1, tree_size=tree_size, depth=depth, draft_s=0.004, target_s=0.020,
        transfer_s=0.010 if transfer_bytes else 0.0, transfer_bytes=transfer_bytes,
        link_idle=0.25 if transfer_bytes else 0.0, finished=finished,
    )


@dataclass
class FakeEngine:
    name: str = "specexec"
    keeps_forms: bool = True
    reply: str = REPLY
    accepted: tuple[int, ...] = ACCEPTED
    delay_s: float = 0.0  # per iteration, to leave time for keys mid-reply (`--fake` dev mode)
    gate: Gate | None = None  # holds each iteration until a test lets it through
    budget: int | str = 16  # or AUTO: each tree then holds AUTO_SIZE tokens
    max_depth: int = 24
    transfer_bytes: int = 0  # per iteration; > 0 makes the engine report offload transfers
    sizes_trees: bool = True  # adopts --budget auto, as SpecExec with probed costs
    calls: list[tuple[list[int], int, SamplingParams]] = field(default_factory=list)  # arguments, for tests
    forgets: int = 0  # how often its caches were dropped

    def live_settings(self) -> LiveSettings:
        return LiveSettings(budget=self.budget, depth=self.max_depth)

    def forget(self) -> None:
        self.forgets += 1

    def apply(self, settings: LiveSettings) -> None:
        if settings.budget is not None and (settings.budget != AUTO or self.sizes_trees):
            self.budget = settings.budget
        self.max_depth = settings.depth if settings.depth is not None else self.max_depth

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
    ) -> Iterator[IterationEvent]:
        for number, (chunk, finished) in enumerate(fake_chunks(self, prompt_ids, max_new_tokens, sampling)):
            size = AUTO_SIZE if self.budget == AUTO else self.budget
            event = fixed_event(chunk, finished, size, min(self.max_depth, len(chunk)), self.transfer_bytes)
            # the first event carries the prefill: the whole prompt, as an engine with nothing kept
            yield replace(event, prefill_tokens=len(prompt_ids), prefill_s=PREFILL_S) if number == 0 else event


@dataclass
class FakePool:
    workers: list[str]  # only counted, as the app counts DSI's pool


@dataclass
class FakeDSIEngine:
    """As DSIEngine: drafts `lookahead` tokens per job (read live), reports its jobs, and says
    WORKER_NOTICE once in its life, on its first event."""

    name: str = "dsi"
    keeps_forms: bool = False
    reply: str = REPLY
    accepted: tuple[int, ...] = ACCEPTED
    delay_s: float = 0.0
    gate: Gate | None = None
    lookahead: int = 5
    pool: FakePool = field(default_factory=lambda: FakePool(["cpu#0", "cpu#1"]))
    calls: list[tuple[list[int], int, SamplingParams]] = field(default_factory=list)
    noticed: bool = field(default=False, init=False)
    forgets: int = 0

    def live_settings(self) -> LiveSettings:
        return LiveSettings(lookahead=self.lookahead, workers=len(self.pool.workers))

    def forget(self) -> None:
        self.forgets += 1

    def apply(self, settings: LiveSettings) -> None:
        self.lookahead = settings.lookahead if settings.lookahead is not None else self.lookahead

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
    ) -> Iterator[IterationEvent]:
        for chunk, finished in fake_chunks(self, prompt_ids, max_new_tokens, sampling):
            # Two jobs sent per event; a chunk shorter than a full job means a rejected draft,
            # and the job built on it is preempted. Fixed, so the panels are reproducible.
            rejected = len(chunk) <= self.lookahead
            yield replace(
                fixed_event(chunk, finished, self.lookahead, self.lookahead), jobs_submitted=2,
                jobs_preempted=int(rejected), jobs_in_flight=0 if finished else len(self.pool.workers),
                notice=self.take_notice(),
            )

    def take_notice(self) -> str:
        if self.noticed:
            return ""
        self.noticed = True
        return WORKER_NOTICE


@dataclass(frozen=True)
class FakeGuide:
    form: dict | str


class FakeBackend:
    name = "fake pair"
    transfer_label = ""

    def __init__(self, engines: list[FakeEngine] | None = None, context: int = 4096) -> None:
        engines = engines or [FakeEngine(), FakeEngine(name="autoregressive", accepted=(0,))]
        self.engines = {engine.name: engine for engine in engines}
        self.engine_names = tuple(self.engines)
        self.engine = next(iter(self.engines.values()))
        self.context = context
        self.max_budget = 8192  # limits.BUDGET's ceiling: a fake plans no memory
        self.settings = settings_for(self.engine, DecodingSettings())
        self.tokenizer = FakeTokenizer()
        self.closes = 0  # how often the app closed the backend: once, as it exits

    def encode(self, messages: list[dict]) -> list[int]:
        turns = "".join(f"<{message['role']}>{message['content']}" for message in messages)
        return self.tokenizer.encode(turns + "<assistant>")

    def new_text_stream(self) -> TextStream:
        return TextStream(self.tokenizer)

    def guide(self, form: dict | str) -> FakeGuide:
        """A stand-in guide naming its form (the fake engines read none); a form holding
        "uncompilable" is refused as the grammar engine refuses one."""
        if "uncompilable" in form:
            raise SpecchatError(f"the {'JSON schema' if isinstance(form, dict) else 'grammar'} cannot be compiled: "
                                "uncompilable")
        return FakeGuide(form)

    def breakers(self) -> Restarts:
        """No breaker: the fake pair has no tokenizer to write one."""
        return ()

    def prediction(self, message: str) -> Prediction | None:
        return quoted_prediction(message, self.tokenizer)

    def use_engine(self, name: str) -> FakeEngine:
        self.engine = self.engines[name]
        return self.engine

    def close(self) -> None:
        self.closes += 1
