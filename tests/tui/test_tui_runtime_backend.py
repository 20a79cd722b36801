"""The real-model backend over tiny random models: engines, settings, and a reply in the app,
with SpecExec and with DSI."""

import asyncio
from dataclasses import replace
from collections.abc import Iterator
from time import perf_counter

import pytest
from helpers.tiny import tiny_models

from specchat.offload.placement import Placement

import torch
from textual.widgets import Static

from specchat.decoding.events import AUTO, LiveSettings
from specchat.decoding.kvcache import cache_length
from specchat.dsi.workers import WorkerPool, thread_workers
from specchat.errors import SpecchatError
from specchat.runtime import Models
from specchat.tui.app import SpecchatApp
from specchat.runtime import transfer_label
from specchat.tui.runtime_backend import RuntimeBackend
from specchat.tui.settings import DecodingSettings
from specchat.tui.store import ConversationStore


class TinyTokenizer:
    """Letters for the tiny models' 50-token vocabulary; a one-line chat template."""

    chat_template = "role: content"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        text = " ".join(f"{m['role']} {m['content']}" for m in messages)
        return {"input_ids": [ord(char) % 50 for char in text]}

    def encode(self, text, add_special_tokens=False):
        return [ord(char) % 50 for char in text]

    def decode(self, token_ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + token % 26) for token in token_ids)


@pytest.fixture
def backend(tiny_target, tiny_draft) -> RuntimeBackend:
    models = tiny_models(tiny_target, tiny_draft, TinyTokenizer())
    settings = DecodingSettings(temperature=0.0, max_tokens=24)
    return RuntimeBackend(models, models.engine("specexec", LiveSettings(budget=8, depth=4)), "tiny pair", settings,
                          transfer_label="")


@pytest.fixture
def dsi_backend(tiny_target, tiny_draft) -> Iterator[RuntimeBackend]:
    pool = WorkerPool(thread_workers(tiny_target, [torch.device("cpu")]))
    models = tiny_models(None, tiny_draft, TinyTokenizer(), workers=pool)  # the target only on the workers
    settings = DecodingSettings(temperature=0.0, max_tokens=24)
    yield RuntimeBackend(models, models.engine("dsi", LiveSettings(lookahead=3)), "tiny pair", settings, "")
    pool.close()


def test_backend_takes_the_tree_shape_and_offers_the_baseline(backend):
    assert backend.engine_names == ("specexec", "autoregressive", "sd", "specinfer")
    assert (backend.settings.budget, backend.settings.depth, backend.settings.engine) == (8, 4, "specexec")
    assert backend.encode([{"role": "user", "content": "hi"}]) == [ord(c) % 50 for c in "user hi"]
    baseline = backend.use_engine("autoregressive")
    assert backend.engine is baseline and baseline.target is backend.engines["specexec"].target


def test_a_model_without_chat_template_is_refused(backend):
    tokenizer = TinyTokenizer()
    tokenizer.chat_template = None
    models = replace(backend.models, tokenizer=tokenizer)
    with pytest.raises(SpecchatError, match="no chat template"):
        RuntimeBackend(models, backend.engine, "base model", DecodingSettings(), "")


def test_closing_the_backend_closes_its_models(backend, monkeypatch):
    closed = []
    monkeypatch.setattr(Models, "close", lambda models: closed.append(models))
    backend.close()
    assert closed == [backend.models]


def placement(resident: int, ram: int, disk: int) -> Placement:
    layers = resident + ram + disk
    return Placement((100,) * layers, resident, ram, disk, slots=2 if ram + disk else 0, slot_bytes=4096, needed=0)


@pytest.mark.parametrize(
    "device, where, label",
    [("cpu", None, ""), ("cpu", placement(4, 0, 0), ""), ("cuda", placement(1, 3, 0), "PCIe"),
     ("cuda", placement(1, 1, 2), "PCIe"), ("cpu", placement(1, 3, 0), "RAM"), ("cpu", placement(0, 0, 4), "disk")],
)
def test_transfer_label(device, where, label):
    assert transfer_label(device, where) == label


async def send_and_wait(app: SpecchatApp, pilot, text: str, timeout_s: float = 30) -> None:
    """Send `text` and wait until its reply is finished and stored."""
    app.prompt.load_text(text)
    await pilot.press("enter")
    deadline = perf_counter() + timeout_s
    while app.session.job is not None or len(app.session.entries) < 2:
        assert perf_counter() < deadline
        await pilot.pause(0.05)


def test_specexec_reply_in_the_app_fills_the_panels(backend, tmp_path):
    app = SpecchatApp(backend, ConversationStore(tmp_path / "history.sqlite3"))

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            await send_and_wait(app, pilot, "hello")
            await pilot.press(*"/budget 4", "enter")
            assert app.backend.engine.shape.budget == 4
            stats = app.panels.stats
            assert stats.iterations > 0 and max(stats.tree_sizes) > 0
            assert sum(len(e.token_ids) for e in app.session.reply_events) == 24
            assert len(app.session.entries[-1].content) == 24

    asyncio.run(scenario())


def test_dsi_is_offered_alone_with_its_lookahead(dsi_backend):
    engine = dsi_backend.engine
    assert dsi_backend.engines == {"dsi": engine} and dsi_backend.engine_names == ("dsi",)
    assert (dsi_backend.settings.engine, dsi_backend.settings.lookahead) == ("dsi", 3)
    assert (dsi_backend.settings.budget, dsi_backend.settings.depth) == (AUTO, 24)  # defaults: dsi has no tree
    assert engine.live_settings() == LiveSettings(lookahead=3, workers=1)


def test_dsi_reply_in_the_app_fills_the_jobs_panel(dsi_backend, tmp_path):
    app = SpecchatApp(dsi_backend, ConversationStore(tmp_path / "history.sqlite3"))

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            settings = str(app.query_one("#settings", Static).content)
            assert "lookahead 3 · workers 1" in settings
            await send_and_wait(app, pilot, "hello")
            events = app.session.reply_events
            sent = sum(e.jobs_submitted for e in events)
            assert sum(len(e.token_ids) for e in events) == 24 and sent >= len(events)
            jobs = str(app.query_one("#jobs", Static).content)
            assert app.query_one("#jobs-section").display and f"reply: sent {sent} · preempted" in jobs
            await pilot.press(*"/lookahead 4", "enter")
            assert app.backend.engine.lookahead == 4

    asyncio.run(scenario())


def test_a_chat_past_a_small_context_keeps_working_and_reuses_the_cache(backend, tmp_path):
    """Ten turns in a 400-token context: the oldest turns go at once with one notice, the system
    prompt stays, the caches never hold more than the context, the turn after a drop prefills
    the shortened history once and later turns only their new tokens; every reply is the one a
    fresh engine gives from a full prefill."""
    from specchat.tui.session import Session

    backend.context = 400
    system = backend.encode([{"role": "system", "content": "be brief"}])
    session = Session(backend, ConversationStore(tmp_path / "history.sqlite3"))
    session.change("system_prompt", "be brief")
    engine = backend.engine
    notes, prefills, prompts = [], [], []
    for turn in range(10):
        outcome = session.send(f"question {turn} about caches")
        job = outcome.job
        events = list(job.engine.generate(job.prompt_ids, job.max_new_tokens, job.sampling))
        for event in events:
            session.record(event, job.stream.push(event.token_ids))
        session.end_reply(cut=False, tail=job.stream.finish())
        tokens = [t for e in events for t in e.token_ids]
        fresh = backend.models.engine("specexec", engine.live_settings())
        assert tokens == [t for e in fresh.generate(job.prompt_ids, job.max_new_tokens, job.sampling) for t in e.token_ids]
        assert len(job.prompt_ids) + len(tokens) <= 400
        assert max(cache_length(cache) for cache in engine.history.caches) <= 400
        assert job.prompt_ids[:len(system)] == system
        notes.append(outcome.notes)
        prefills.append(events[0].prefill_tokens)
        prompts.append(len(job.prompt_ids))
    drops = [turn for turn, note in enumerate(notes) if note]
    assert drops and all("left out (system prompt kept)" in notes[turn][0].text for turn in drops)
    assert all(later - earlier > 1 for earlier, later in zip(drops, drops[1:]))  # a drop leaves room for more turns
    for turn in drops:  # the shortened history is prefilled once...
        assert prefills[turn] > prompts[turn] // 2
    # ...then only the new exchange (this tokenizer does not re-encode a reply to its own ids)
    quiet = [turn for turn in range(1, 10) if turn not in drops]
    assert quiet and all(prefills[turn] <= prompts[turn] - prompts[turn - 1] + 1 for turn in quiet)
