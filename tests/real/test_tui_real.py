"""The real embedded pair end to end in the app: loading screen, a short reply, live panels."""

import asyncio
from time import perf_counter

import pytest
from textual.widgets import Static

from specchat.engine_options import EngineOptions
from specchat.runtime import pick_device
from specchat.tui.app import SpecchatApp
from specchat.tui.runtime_backend import runtime_loader
from specchat.tui.settings import DecodingSettings
from specchat.tui.store import ConversationStore

pytestmark = pytest.mark.real


async def wait_until(pilot, condition, seconds: float) -> None:
    deadline = perf_counter() + seconds
    while not condition():
        assert perf_counter() < deadline, "timed out"
        await pilot.pause(0.1)


@pytest.mark.parametrize("offload", ["none", "disk"])
def test_real_pair_reply_fills_the_panels(tmp_path, offload_dir, offload):
    options = EngineOptions(budget=16, offload=offload, offload_dir=str(offload_dir),
                            resident_layers=24 if offload == "disk" else None)  # 4 layers streamed
    loader = runtime_loader(options, DecodingSettings(temperature=0.0, max_tokens=12))
    store = ConversationStore(tmp_path / "history.sqlite3")
    app = SpecchatApp(None, store, loader=loader)

    async def scenario():
        async with app.run_test(size=(140, 45)) as pilot:
            await wait_until(pilot, lambda: getattr(app, "backend", None) is not None, 600)
            app.prompt.load_text("Write a Python function that adds two numbers.")
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.session.job is None and len(app.session.entries) >= 2, 600)
            stats = app.panels.stats
            assert stats.iterations > 0 and max(stats.tree_sizes) > 0
            assert sum(stats.accepted) > 0
            assert sum(len(e.token_ids) for e in app.session.reply_events) == 12
            assert app.session.entries[-1].content.strip()
            transfer = str(app.query_one("#transfer", Static).content)
            if offload == "disk":
                label = "PCIe" if pick_device().type == "cuda" else "disk"  # the link weights cross
                assert stats.last.transfer_bytes > 0 and transfer.startswith(f"transfer {label}: ")
            else:
                assert transfer == "transfer: none (weights resident)"

    asyncio.run(scenario())
