"""llama.cpp's warm-up: a request on its own routes with `n_predict: 0` (llama.vim sends its ring
of context chunks so, every second or so) returns nothing but has its prompt computed into a slot,
so that the next request sharing that prefix computes only the rest; with `cache_prompt: false`
nothing runs. A warm-up still waiting gives way to any request after it."""

import asyncio

import pytest
from helpers.serve_helpers import TINY_TOKENIZER, make_app, post_json, serving

from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.fim import FimTokens
from specchat.serve.scheduler import END, Job, Scheduler
from specchat.tui.fake import FakeEngine

CURSOR = {"input_prefix": "def f():\n", "prompt": "    ret", "input_suffix": "\nprint(f())\n"}
RING = {"input_prefix": "", "input_suffix": "", "prompt": "", "input_extra": [{"filename": "a.py", "text": "x = 1\n"}],
        "n_predict": 0, "temperature": 0.0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 1,
        "t_max_predict_ms": 1, "response_fields": [""]}  # llama.vim's ring update, as it sends it


@pytest.mark.parametrize("route", ["/infill", "/completion"])
def test_n_predict_0_computes_the_prompt_and_one_token_and_returns_nothing(route):
    engine = FakeEngine()
    app, _ = make_app([engine], fim=FimTokens("<P>", "<S>", "<M>", "<R>", "<F>"))
    body = (CURSOR if route == "/infill" else {"prompt": "hello"}) | {"n_predict": 0}
    with serving(app) as url:
        reply = post_json(f"{url}{route}", body)
        ring = RING if route == "/infill" else {"prompt": "x", "n_predict": 0, "response_fields": [""]}
        assert post_json(f"{url}{route}", ring) == {}  # the field llama.vim asks for is none: nothing to read
    assert [max_new_tokens for _, max_new_tokens, _ in engine.calls] == [1, 1]  # the prompt's pass gives the token
    assert reply["content"] == "" and reply["tokens_predicted"] == 0 and reply["stop"] is True


def test_without_cache_prompt_n_predict_0_runs_nothing():
    engine = FakeEngine()
    app, _ = make_app([engine])
    with serving(app) as url:
        reply = post_json(f"{url}/completion", {"prompt": "hello", "n_predict": 0, "cache_prompt": False})
    assert reply["content"] == "" and engine.calls == []


def test_the_next_request_reuses_the_warmed_prefix_and_decodes_what_a_cold_server_decodes(tiny_target, tiny_draft):
    """On the tiny models: after a warm-up of `context`, a request that continues it computes only
    its own tokens (llama.cpp's `timings.cache_n` counts the rest), and its greedy reply is the
    reply of a server that was never warmed."""
    context, cursor = list(range(5, 45)), [7, 8, 9]

    def served(warm: bool) -> dict:
        engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, frozenset(), TreeShape(budget=8, max_depth=4))
        app, _ = make_app([engine], tokenizer=TINY_TOKENIZER, stop_ids=frozenset(), context=1024)
        with serving(app) as url:
            if warm:
                post_json(f"{url}/completion", {"prompt": context, "n_predict": 0})
            return post_json(f"{url}/completion", {"prompt": context + cursor, "n_predict": 12, "temperature": 0})

    warmed, cold = served(True), served(False)
    assert warmed["timings"]["cache_n"] == len(context) and warmed["timings"]["prompt_n"] == len(cursor)
    assert cold["timings"]["cache_n"] == 0
    assert warmed["content"] == cold["content"] and warmed["tokens_predicted"] == 12


def test_a_waiting_warm_up_gives_way_to_any_request_after_it():
    """The decoding thread not started, so the queue holds what was submitted: a second warm-up
    takes the first's place, a completion takes the second's, and each warm-up dropped is ended."""

    async def queued() -> tuple[list[Job], list[list]]:
        scheduler, loop = Scheduler([FakeEngine()], max_queue=4), asyncio.get_running_loop()
        jobs = [Job([1, 2], 1, SamplingParams(), loop, warm=True), Job([1, 2, 3], 1, SamplingParams(), loop, warm=True),
                Job([1, 2, 3, 4], 8, SamplingParams(), loop)]
        for job in jobs:
            scheduler.submit(job)
        await asyncio.sleep(0)  # the ends delivered to the dropped jobs' inboxes
        return list(scheduler.waiting), [[job.inbox.get_nowait() for _ in range(job.inbox.qsize())] for job in jobs]

    waiting, inboxes = asyncio.run(queued())
    assert [len(job.prompt_ids) for job in waiting] == [4]
    assert inboxes == [[END], [END], []]
