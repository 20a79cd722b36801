"""The app's pure parts: context fitting, input recall, code-block copy, live figures, panel
texts, the decoding loop and the fake dsi engine."""

import threading
from dataclasses import replace

import pytest

from specchat.decoding.events import ALONE, DRAFTED, LOOK, IterationEvent, LiveSettings, SamplingParams
from specchat.errors import ContextOverflow
from specchat.tui.clipboard import last_code_block
from specchat.tui.context import fit_prompt
from specchat.tui.decoder import decode_reply, run_events
from specchat.tui.fake import REPLY, WORKER_NOTICE, FakeBackend, FakeDSIEngine, FakeEngine, FakeTokenizer
from specchat.tui.history import InputHistory
from specchat.tui.livestats import WINDOW, LiveStats, stats_report
from specchat.tui.messages import EngineNotice, IterationArrived, ReplyFinished
from specchat.tui.panels import acceptance_text, jobs_text, settings_text, timing_text, transfer_text, tree_text
from specchat.tui.reply import ReplyJob
from specchat.tui.settings import DecodingSettings
from specchat.tui.transcript import title_of
from specchat.summary import summarize
from specchat.textstream import TextStream

HANG_S = 30  # bound on a wait that only guards against a hang


def encode(messages):
    return FakeBackend().encode(messages)


def turns(*contents):
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(contents)]


def test_a_conversation_is_titled_by_its_first_line_up_to_60_characters():
    assert title_of("  hello\nworld") == "hello"
    assert title_of("x" * 60) == "x" * 60
    assert title_of("x" * 61) == "x" * 59 + "…"


def test_prompt_fits_untouched_when_short():
    prompt = fit_prompt([], turns("hi"), encode, context=1000, max_tokens=100)
    assert prompt.dropped == 0
    assert prompt.ids == encode(turns("hi"))
    assert prompt.max_new_tokens == 100


def test_oldest_exchanges_are_dropped_first_and_system_kept():
    system = [{"role": "system", "content": "S"}]
    history = turns("a" * 40, "b" * 40, "c" * 40, "d" * 40, "e")
    prompt = fit_prompt(system, history, encode, context=200, max_tokens=60)
    # 200 - 60 leaves 140 tokens: 221 do not fit; exchanges go, as pairs, until the prompt
    # fills at most 3/4 of them (105): dropping one (124 left) is not enough, two are.
    assert len(encode(system + history)) == 221 and len(encode(system + history[2:])) == 124
    assert prompt.dropped == 4
    assert prompt.ids == encode(system + history[4:])
    assert prompt.max_new_tokens == 60


def test_a_question_left_without_a_reply_goes_alone():
    """Two user messages in a row (the first had no room for its reply): dropping the first keeps
    the second, which starts the next exchange."""
    history = [{"role": "user", "content": "x" * 150}, *turns("q", "r", "s")]
    prompt = fit_prompt([], history, encode, context=200, max_tokens=60)
    assert prompt.dropped == 1 and prompt.ids == encode(history[1:])


def test_dropping_stops_once_the_prompt_fills_three_quarters_of_its_room():
    at_most = turns("a" * 40, "b" * 40, "c" * 35, "d" * 35, "e")
    one_more = turns("a" * 40, "b" * 40, "c" * 35, "d" * 36, "e")
    assert (len(encode(at_most[2:])), len(encode(one_more[2:]))) == (105, 106)  # 3/4 of 200 - 60 is 105
    assert fit_prompt([], at_most, encode, context=200, max_tokens=60).dropped == 2
    assert fit_prompt([], one_more, encode, context=200, max_tokens=60).dropped == 4


def test_dropped_turns_stay_out_and_the_next_prompts_extend_the_last():
    """Once turns were dropped, the prompt starts there even when more would fit now, so each
    prompt extends the previous one (and the engine reuses its cache) until the next drop."""
    history = turns("a" * 30, "b" * 30, "c" * 10, "d" * 10, "e")
    first = fit_prompt([], history[:3], encode, context=200, max_tokens=60, start=2)
    second = fit_prompt([], history, encode, context=200, max_tokens=60, start=first.dropped)
    assert first.dropped == second.dropped == 2
    assert second.ids[:len(first.ids) - len("<assistant>")] == first.ids[:-len("<assistant>")]
    assert len(encode(history)) <= 140  # the whole history would fit: it is not brought back


def test_a_conversation_ending_in_replies_keeps_at_least_its_last_message():
    """No user message follows the first to drop to: all go but the last message (a reply to
    continue, as a front end may send)."""
    history = turns("q", "a" * 100) + [{"role": "assistant", "content": "b" * 20}]
    prompt = fit_prompt([], history, encode, context=200, max_tokens=60)
    assert prompt.dropped == 2 and prompt.ids == encode(history[2:])
    past = fit_prompt([], history, encode, context=200, max_tokens=60, start=5)  # more dropped before than are left
    assert past.dropped == 2 and past.ids == encode(history[2:])


def test_reply_room_is_capped_at_half_the_context():
    """A max-tokens far past the context keeps half of it (100 tokens) for the reply, not all of
    it: a conversation of 100 tokens stays whole, one of 101 loses its oldest exchange."""
    fits, over = turns("a" * 20, "b" * 20, "c" * 26), turns("a" * 20, "b" * 20, "c" * 27)
    assert (len(encode(fits)), len(encode(over))) == (100, 101)
    prompt = fit_prompt([], fits, encode, context=200, max_tokens=10_000)
    assert prompt.dropped == 0 and prompt.ids == encode(fits)
    assert prompt.max_new_tokens == 100  # the reply may use all the room the prompt leaves
    assert fit_prompt([], over, encode, context=200, max_tokens=10_000).dropped == 2


def test_a_message_larger_than_the_context_is_refused():
    prompt = len("<user>") + 200 + len("<assistant>")  # the fake tokenizer: a token a character
    with pytest.raises(ContextOverflow, match=f"the prompt is {prompt} tokens, which leaves no room for a reply in the "
                                              "100-token context: shorten it"):
        fit_prompt([], turns("x" * 200), encode, context=100, max_tokens=10)


def test_input_recall_walks_back_and_returns_to_the_draft():
    history = InputHistory(["one", "two"])
    assert history.next() is None
    assert history.previous("draft") == "two"
    assert history.previous("two") == "one"
    assert history.previous("one") == "one"
    assert history.next() == "two"
    assert history.next() == "draft"
    assert history.next() is None
    history.add("three")
    history.add("three")
    assert history.entries == ["one", "two", "three"]


def test_last_code_block():
    assert last_code_block(REPLY) == 'def greet(name):\n    return f"hello {name}"'
    assert last_code_block("no code here") is None
    assert last_code_block("```\nunfinished") is None


def event(accepted, tree_size=16, **costs):
    """An iteration that accepted `accepted` tokens; `costs` replace its times (and any other field)."""
    return IterationEvent(token_ids=[1] * (accepted + 1), accepted=accepted, tree_size=tree_size,
                          depth=accepted + 1, **{"draft_s": 0.01, "target_s": 0.03, **costs})


def test_live_stats_window_mean_rate_and_bandwidth():
    stats = LiveStats()
    for i in range(WINDOW + 10):
        stats.record(event(i % 4))
    assert len(stats.accepted) == WINDOW
    assert stats.mean_accepted == pytest.approx(1.5)
    stats.start_reply()
    stats.record(event(3, transfer_s=0.5, transfer_bytes=10**9))
    assert stats.tokens_per_s == pytest.approx(4 / 0.04)  # streaming overlaps the passes
    assert stats.transfer_gb_per_s == pytest.approx(2.0)


def test_before_any_reply_every_figure_is_zero_and_stats_says_so():
    stats = LiveStats()
    assert (stats.mean_accepted, stats.tokens_per_s, stats.transfer_gb_per_s) == (0.0, 0.0, 0.0)
    assert stats_report(None, stats) == "no reply yet"


def test_the_tree_window_keeps_the_last_trees_down_to_a_one_node_tree():
    stats = LiveStats()
    for size in range(WINDOW + 10, 0, -1):  # the last tree a single node
        stats.record(IterationEvent(token_ids=[1], accepted=0, tree_size=size, depth=1, draft_s=0.0, target_s=0.1))
    assert list(stats.tree_sizes) == list(range(WINDOW, 0, -1)) and len(stats.accepted) == WINDOW


def test_stats_reports_the_last_replys_totals_and_the_sessions_acceptance():
    stats = LiveStats()
    events = [event(3, transfer_s=0.25), event(1)]
    for e in events:
        stats.record(e)
    summary = replace(summarize(events, 0.5), prefill_tokens=12, prefill_s=0.125)
    assert stats_report(summary, stats) == (
        "last reply: 6 tokens in 2 iterations (3.00 per iteration), 12.0 tokens/s; "
        "draft 0.02 s, target 0.06 s, transfer 0.25 s; prefill 12 tokens in 0.12 s\n"
        "session: 2 iterations, mean accepted 2.00 over the last 2")


def test_the_prompts_pass_counts_in_the_reply_but_not_in_the_tree_figures():
    stats = LiveStats()
    stats.record(event(3))
    stats.record(IterationEvent(token_ids=[1], accepted=0, tree_size=0, depth=0, draft_s=0.0, target_s=0.5))
    assert list(stats.accepted) == [3] and list(stats.tree_sizes) == [event(3).tree_size]
    assert stats.iterations == 2 and stats.reply_tokens == 5


def auto_event(drafting, tree_size):
    return IterationEvent(token_ids=[1], accepted=0, tree_size=tree_size, depth=min(tree_size, 1), draft_s=0.0,
                          target_s=0.08, drafting=drafting, rate_with_tree=10.4, rate_alone=11.7)


def test_the_panel_and_stats_say_when_drafting_is_off_and_why():
    stats = LiveStats()
    stats.record(auto_event(DRAFTED, 3))
    assert tree_text(stats) == "size 3 · depth 1"
    assert "drafting off" not in stats_report(summarize([stats.last], 1.0), stats)
    stats.start_reply()
    events = [auto_event(ALONE, 0), auto_event(LOOK, 2), auto_event(ALONE, 0)]
    for e in events:
        stats.record(e)
    assert tree_text(stats) == "drafting off: target alone\n11.7 tok/s vs 10.4 with a tree"
    assert stats_report(summarize(events, 1.0), stats).endswith(
        "drafting off in 2 of 3 iterations of the last reply (1 looks): predicted 11.7 tokens/s for the target "
        "alone against 10.4 with a tree")
    stats.record(auto_event(LOOK, 2))
    assert tree_text(stats) == "size 2 · depth 1 · a look"


def jobs_event(submitted, preempted, in_flight):
    return IterationEvent(token_ids=[1], accepted=0, tree_size=4, depth=4, draft_s=0.01, target_s=0.03,
                          jobs_submitted=submitted, jobs_preempted=preempted, jobs_in_flight=in_flight)


def test_jobs_text_shows_the_last_event_and_the_reply_totals():
    stats = LiveStats()
    assert jobs_text(stats) == "sent – · preempted – · in flight –\nreply: sent 0 · preempted 0"
    stats.record(jobs_event(9, 9, 9))
    stats.start_reply()  # totals are per reply
    for submitted, preempted, in_flight in [(3, 0, 2), (1, 2, 1), (2, 1, 3)]:
        stats.record(jobs_event(submitted, preempted, in_flight))
    assert jobs_text(stats) == "sent 2 · preempted 1 · in flight 3\nreply: sent 6 · preempted 3"


def test_the_figures_before_any_iteration_are_dashes_and_zeros():
    stats = LiveStats()
    assert acceptance_text(stats) == "last 0 · mean 0.00 over 0"
    assert tree_text(stats) == "size – · depth –"
    assert timing_text(stats) == "draft 0.0 ms · target 0.0 ms\n0.0 tokens/s"
    assert transfer_text(stats, "RAM->GPU") == "transfer RAM->GPU: 0.0 ms\n0.00 GB/s · stall 0.0 ms\nlink idle 0%"


def test_the_figures_show_the_last_iteration_and_the_means():
    stats = LiveStats()
    stats.start_reply()
    for accepted, draft_s in ((1, 0.010), (4, 0.0125)):
        stats.record(event(accepted, draft_s=draft_s, target_s=0.0375, transfer_s=0.2, transfer_bytes=10**8,
                           stall_s=0.0015, link_idle=0.25))
    assert acceptance_text(stats) == "last 4 · mean 2.50 over 2"
    # 7 tokens over (0.0475 + 0.05) s of drafting and scoring
    assert timing_text(stats) == "draft 12.5 ms · target 37.5 ms\n71.8 tokens/s"
    assert transfer_text(stats, "disk") == "transfer disk: 200.0 ms\n0.50 GB/s · stall 1.5 ms\nlink idle 25%"
    assert transfer_text(stats, "") == "transfer: none (weights resident)"


def test_settings_text_shows_lookahead_and_workers_for_dsi_only():
    tree = DecodingSettings(budget=32, depth=8, lookahead=7)
    assert settings_text(tree, workers=0) == "engine specexec\nbudget 32 · depth 8\ntemp 0.6 · top-p 0.9 · seed 0"
    dsi = DecodingSettings(engine="dsi", lookahead=7, seed=None)
    assert settings_text(dsi, workers=3) == "engine dsi\nlookahead 7 · workers 3\ntemp 0.6 · top-p 0.9 · seed off"


def test_settings_text_shows_the_cuts_and_the_repeat_penalty_on_a_line_of_their_own_only_where_on():
    base = "engine specexec\nbudget auto · depth 24\ntemp 0.6 · top-p 0.9 · seed 0"
    assert settings_text(DecodingSettings(top_k=0, min_p=0.0), workers=0) == base
    assert settings_text(DecodingSettings(top_k=-1), workers=0) == base  # -1: off, as vLLM's
    assert settings_text(DecodingSettings(top_k=40), workers=0) == base + "\ntop-k 40"
    assert settings_text(DecodingSettings(top_k=1), workers=0) == base + "\ntop-k 1"
    assert settings_text(DecodingSettings(top_n_sigma=0.5), workers=0) == base + "\ntop-n-sigma 0.5"
    assert settings_text(DecodingSettings(min_p=0.05), workers=0) == base + "\nmin-p 0.05"
    assert settings_text(DecodingSettings(top_k=3, min_p=0.2), workers=0) == base + "\ntop-k 3 · min-p 0.2"
    assert settings_text(DecodingSettings(typical_p=0.9), workers=0) == base + "\ntypical-p 0.9"
    assert settings_text(DecodingSettings(top_n_sigma=0), workers=0) == base  # <= 0: off, as llama.cpp's -1
    assert settings_text(DecodingSettings(dry_multiplier=0.8), workers=0) == (
        base + "\ndry 0.8 (base 1.75, allowed 2)/all")
    assert settings_text(DecodingSettings(dry_multiplier=0.8, dry_penalty_last_n=0), workers=0) == (
        base + "\ndry 0.8 (base 1.75, allowed 2)/0")
    assert settings_text(DecodingSettings(top_n_sigma=1.5, xtc_probability=0.5), workers=0) == (
        base + "\ntop-n-sigma 1.5 · xtc 0.5 (threshold 0.1)")
    assert settings_text(DecodingSettings(dynatemp_range=0.5), workers=0) == base + "\ndynatemp ±0.5 (exponent 1)"
    assert settings_text(DecodingSettings(mirostat=2), workers=0) == base + "\nmirostat 2 (tau 5, eta 0.1)"
    assert settings_text(DecodingSettings(repeat_penalty=1.1), workers=0) == base + "\nrepeat 1.1/64"
    assert settings_text(DecodingSettings(repeat_penalty=1.3, repeat_last_n=-1), workers=0) == base + "\nrepeat 1.3/all"
    assert settings_text(DecodingSettings(repeat_penalty=1.3, repeat_last_n=0), workers=0) == base + "\nrepeat 1.3/0"
    both = DecodingSettings(presence_penalty=0.5, frequency_penalty=-0.25, repeat_last_n=16)
    assert settings_text(both, workers=0) == base + "\npresence 0.5/16 · frequency -0.25/16"


def test_settings_sampling_carries_the_cuts_with_top_k_off_as_zero():
    assert (DecodingSettings(top_k=5, min_p=0.1).sampling().top_k, DecodingSettings(min_p=0.1).sampling().min_p) == (
        5, 0.1)
    assert DecodingSettings(typical_p=0.7).sampling().typical_p == 0.7
    llamas = DecodingSettings(top_n_sigma=1.5, xtc_probability=0.5, xtc_threshold=0.2).sampling()
    assert (llamas.top_n_sigma, llamas.xtc_probability, llamas.xtc_threshold) == (1.5, 0.5, 0.2)
    dynamic = DecodingSettings(dynatemp_range=0.5, dynatemp_exponent=2.0).sampling()
    assert (dynamic.dynatemp_range, dynamic.dynatemp_exponent) == (0.5, 2.0)
    assert DecodingSettings().sampling().mirostat is None


def test_settings_sampling_starts_each_replys_mirostat_afresh():
    settings = DecodingSettings(mirostat=1, mirostat_tau=3.0, mirostat_eta=0.2)
    first, second = settings.sampling().mirostat, settings.sampling().mirostat
    assert first is not second and first.mu == second.mu == 6.0  # 2 tau
    assert (first.spec.version, first.spec.tau, first.spec.eta) == (1, 3.0, 0.2)
    assert DecodingSettings(top_k=-1).sampling().top_k == 0


def job(engine, **kwargs):
    return ReplyJob(1, engine, [1, 2, 3], 1000, SamplingParams(), TextStream(FakeTokenizer()), **kwargs)


def test_decode_reply_posts_every_iteration_then_the_tail():
    posted = []
    engine = FakeEngine()
    decode_reply(job(engine), threading.Lock(), posted.append)
    arrived = [m for m in posted if isinstance(m, IterationArrived)]
    assert "".join(m.text for m in arrived) + posted[-1].text == REPLY
    assert isinstance(posted[-1], ReplyFinished)
    assert [m.event.accepted for m in arrived[:3]] == [3, 1, 4]


def test_decode_reply_stops_at_the_first_event_after_cancel():
    posted = []
    reply = job(FakeEngine())

    def post(message):
        posted.append(message)
        reply.cancel.set()

    decode_reply(reply, threading.Lock(), post)
    assert len(posted) == 1  # one iteration, no ReplyFinished


def test_decode_reply_posts_a_notice_even_after_cancel():
    posted = []
    reply = job(FakeDSIEngine())
    reply.cancel.set()
    run_events(reply, posted.append)  # as if cancelled while the first iteration ran
    assert posted == [EngineNotice(WORKER_NOTICE)]


def test_decode_reply_posts_the_notice_before_its_iteration():
    posted = []
    decode_reply(job(FakeDSIEngine()), threading.Lock(), posted.append)
    assert posted[0] == EngineNotice(WORKER_NOTICE)
    assert isinstance(posted[1], IterationArrived) and posted[1].event.notice == WORKER_NOTICE
    assert sum(isinstance(m, EngineNotice) for m in posted) == 1


def test_fake_dsi_engine_reads_its_lookahead_live_and_notices_once():
    engine = FakeDSIEngine()
    first = list(engine.generate([1], 40, SamplingParams()))
    engine.apply(LiveSettings(lookahead=2))
    second = list(engine.generate([1], 40, SamplingParams()))
    assert [e.notice for e in first + second] == [WORKER_NOTICE] + [""] * (len(first) + len(second) - 1)
    assert {e.tree_size for e in first} == {5} and {e.tree_size for e in second} == {2}
    assert all(e.jobs_submitted == 2 for e in first) and first[-1].jobs_in_flight == 0
    assert [e.jobs_preempted for e in first[:6]] == [1, 1, 1, 1, 1, 0]  # chunks of 4 2 5 1 3 6 tokens
    assert FakeBackend([engine]).settings.lookahead == 2


class AskedLock:
    """A lock that says when a thread first asks for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked = threading.Event()

    def __enter__(self) -> None:
        self.asked.set()
        self.lock.acquire()

    def __exit__(self, *_exc) -> None:
        self.lock.release()


def test_decode_reply_waits_for_the_engine_lock():
    lock, posted = AskedLock(), []
    reply = job(FakeEngine())
    with lock:
        thread = threading.Thread(target=decode_reply, args=(reply, lock, posted.append))
        thread.start()
        assert lock.asked.wait(HANG_S)
        # It asked while this thread holds the lock: it cannot have run the engine.
        assert posted == [] and reply.engine.calls == []
        reply.cancel.set()  # cut while it waited: it must not start decoding
    thread.join(HANG_S)
    assert not thread.is_alive()
    assert posted == [] and reply.engine.calls == []
