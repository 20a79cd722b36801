"""Soak: a TURNS-turn scripted chat through the app (Pilot) on the real embedded pair, short replies.
The process's resident memory, less the kept caches' buffers (they grow with the conversation, up
to the context), stays within 5% of what it was after warm-up; the engine's kept caches never hold
more than the context, and every turn after the first prefills only what follows the reused
history. Each reading first hands the heap's free pages back to the OS (heap_trim), so it counts
what the process holds, not what glibc keeps of what it freed."""

import asyncio
from pathlib import Path
from time import perf_counter

import pytest
from helpers.suite_scale import scaled

from specchat.bench.datasets import mtbench_first_turns
from specchat.decoding.kvcache import cache_length
from specchat.engine_options import EngineOptions
from specchat.heap_trim import release_free_heap
from specchat.tui.app import SpecchatApp
from specchat.tui.runtime_backend import runtime_loader
from specchat.tui.settings import DecodingSettings
from specchat.tui.store import ConversationStore

pytestmark = pytest.mark.real

TURNS = scaled(30)  # 15 where the run is scaled down (tests/helpers/suite_scale.py)
WARM_UP = 5  # turns before the reference reading: allocator pools and lazy imports settle
REPLY_TOKENS = 4  # what is soaked is the turns: the reply's length changes no reading


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc), after returning the heap's free pages."""
    release_free_heap()
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


def buffer_bytes(caches) -> int:
    """Bytes of the kept caches' key and value buffers (decoding/kvcache.py's SlotLayers)."""
    return sum(layer.key_slots.nbytes + layer.value_slots.nbytes
               for cache in caches for layer in cache.layers if layer.is_initialized)


async def wait_until(pilot, condition, seconds: float) -> None:
    deadline = perf_counter() + seconds
    while not condition():
        assert perf_counter() < deadline, "timed out"
        await pilot.pause(0.05)


def test_every_turn_keeps_memory_flat_and_caches_within_the_context(tmp_path):
    options = EngineOptions(budget=16)
    loader = runtime_loader(options, DecodingSettings(temperature=0.0, max_tokens=REPLY_TOKENS))
    app = SpecchatApp(None, ConversationStore(tmp_path / "history.sqlite3"), loader=loader)
    questions = [question[:120] for question in mtbench_first_turns(TURNS)]
    readings, prefills, prompts = [], [], []

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: getattr(app, "backend", None) is not None, 600)
            engine = app.backend.engine
            for turn, question in enumerate(questions, 1):
                app.prompt.load_text(question)
                await pilot.press("enter")
                await wait_until(pilot, lambda: app.session.job is None and len(app.session.entries) == 2 * turn, 600)
                prompts.append(len(engine.history.tokens) - sum(len(e.token_ids) for e in app.session.reply_events))
                prefills.append(app.session.reply_events[0].prefill_tokens)
                held = [cache_length(cache) for cache in engine.history.caches]
                assert max(held) <= app.backend.context
                readings.append(resident_bytes() - buffer_bytes(engine.history.caches))

    asyncio.run(scenario())
    warm, last = readings[WARM_UP - 1], readings[-1]
    assert max(readings[WARM_UP:]) <= warm * 1.05, [r // 2**20 for r in readings]
    assert last <= warm * 1.05
    # every later turn runs its own question and template, not the history again
    assert all(prefill < prompt // 2 for prefill, prompt in zip(prefills[WARM_UP:], prompts[WARM_UP:])), (prefills, prompts)
