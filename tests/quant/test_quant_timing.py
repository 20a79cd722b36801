"""quant.timing, the clock of every quant probe, checked with a fake clock: each candidate's time is
the fastest of RUNS timed calls after one untimed warm-up call, the candidates run in turns (each
round reversing the last's order), the clock is read only after a synchronize of the device, a
candidate wins only by more than the trials' spread, load that slows every other trial decides
nothing, the sweeps decide from `faster` alone, and on CUDA each width is captured once and replayed."""

import pytest
import torch

from specchat import device_clock
from specchat.quant import timing
from specchat.quant.timing import MAX_RUNS, LinearShape, best_seconds, crossover, faster, widest_win, winning_span

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


class FakeClock:
    """perf_counter's stand-in: time moves only when a scripted run says how long it took."""

    def __init__(self) -> None:
        self.time = 0.0
        self.events: list = []

    def read(self) -> float:
        self.events.append("clock")
        return self.time

    def run(self, name: str, durations: list[float]):
        """A candidate whose calls take `durations` seconds, one after another."""
        remaining = iter(durations)

        def call() -> None:
            self.events.append(name)
            self.time += next(remaining)
        return call


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(device_clock, "perf_counter", fake.read)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: fake.events.append(("sync", device)))
    monkeypatch.setattr(timing, "RUNS", 3)
    return fake


def test_each_time_is_the_fastest_timed_call_after_an_untimed_warm_up(clock):
    # the warm-ups are the fastest calls: were either timed, it would be the minimum
    first, second = clock.run("first", [1, 5, 3, 4]), clock.run("second", [1, 6, 2, 7])
    assert best_seconds((first, second), CPU) == [3, 2]
    calls = [event for event in clock.events if event != "clock"]
    # warm-ups, then the timed calls in turns, every other round in reverse
    assert calls == ["first", "second"] + ["first", "second", "second", "first", "first", "second"]
    assert clock.events[:3] == ["first", "second", "clock"]  # no clock read around a warm-up


def test_on_cuda_the_clock_is_read_after_the_device_finishes(clock):
    best_seconds((clock.run("work", [1, 1, 1, 1]),), CUDA)
    timed = clock.events[1:]  # after the warm-up
    assert timed == [("sync", CUDA), "clock", "work", ("sync", CUDA), "clock"] * 3


def test_the_candidates_run_without_autograd(clock):
    modes = []
    best_seconds((lambda: modes.append(torch.is_inference_mode_enabled()),), CPU)
    assert modes == [True] * (1 + timing.RUNS)


class BusyClock(FakeClock):
    """A machine a build shares: every other call, warm-ups counted, takes `slowdown` seconds more."""

    def __init__(self, slowdown: float) -> None:
        super().__init__()
        self.slowdown, self.calls = slowdown, 0

    def product(self, seconds: float):
        """A candidate that takes `seconds` alone."""
        def call() -> None:
            self.time += seconds + (self.slowdown if self.calls % 2 else 0.0)
            self.calls += 1
        return call


@pytest.mark.parametrize("slowdown", [0.0, 1.0, 5.0])
def test_a_build_slowing_every_other_trial_does_not_decide_which_product_is_faster(monkeypatch, slowdown):
    """Calls in first-second turns would put every slowed call on the second product (the
    choice would then follow the load); reversing every other round gives each product unslowed
    trials, and its fastest counts."""
    busy = BusyClock(slowdown)
    monkeypatch.setattr(device_clock, "perf_counter", busy.read)
    monkeypatch.setattr(timing, "RUNS", 3)
    slow, quick = busy.product(1.2), busy.product(1.0)
    assert faster(quick, slow, CPU)
    assert not faster(slow, quick, CPU)


def scripted_faster(clock: FakeClock, first: list[float], second: list[float]) -> bool:
    """`faster` over two candidates whose calls take these seconds (warm-up first), and how many."""
    return faster(clock.run("first", first), clock.run("second", second), CPU)


def test_a_margin_within_the_trials_spread_is_no_win(clock):
    # first's fastest is 0.1 s ahead, but its next fastest trial is 0.3 s behind its fastest
    first = [9.0, 1.0] + [1.3] * (MAX_RUNS - 1)
    second = [9.0] + [1.1] * MAX_RUNS
    assert not scripted_faster(clock, first, second)
    assert clock.events.count("first") == 1 + MAX_RUNS  # more trials were taken before giving up


def test_a_margin_as_wide_as_the_spread_is_no_win(clock):
    # first's fastest is 0.5 s ahead, and its next fastest trial 0.5 s behind its fastest
    assert not scripted_faster(clock, [9.0, 1.0] + [1.5] * (MAX_RUNS - 1), [9.0] + [1.5] * MAX_RUNS)


def test_a_margin_past_the_spread_wins_after_the_first_rounds(clock):
    assert scripted_faster(clock, [9.0, 1.0, 1.0, 1.0], [9.0, 2.0, 2.0, 2.0])
    assert clock.events.count("first") == 1 + timing.RUNS


@pytest.mark.parametrize("first, second, expected", [(1.0, 2.0, True), (2.0, 1.0, False), (1.0, 1.0, False)])
def test_faster_needs_the_first_to_be_strictly_faster(clock, first, second, expected):
    assert scripted_faster(clock, [first] * (1 + MAX_RUNS), [second] * (1 + MAX_RUNS)) is expected


WIDTHS = (1, 2, 4, 8)


def sweep(how, monkeypatch, winning: set[int]) -> tuple[int | None, list[int]]:
    """What the sweep `how` decides over WIDTHS where a stand-in for `faster` lets the candidate
    (which returns its rows) win at the widths in `winning`, and the widths it timed."""
    timed: list[int] = []

    def stand_in(first, second, device) -> bool:
        rows = first()
        assert second() == -rows and device == CPU  # both products, at one width
        timed.append(rows)
        return rows in winning

    monkeypatch.setattr(timing, "faster", stand_in)
    return how(WIDTHS, lambda rows: rows, lambda rows: -rows, CPU), timed


@pytest.mark.parametrize("winning, expected, timed", [
    ({4, 8}, 4, [1, 2, 4]),  # widths past the first win are not timed
    ({2}, 2, [1, 2]),
    (set(), None, [1, 2, 4, 8]),
])
def test_the_crossover_is_the_first_width_the_candidate_wins(monkeypatch, winning, expected, timed):
    assert sweep(crossover, monkeypatch, winning) == (expected, timed)


@pytest.mark.parametrize("winning, expected, timed", [
    ({1, 2, 8}, 2, [1, 2, 4]),  # a win past a loss does not count, nor is it timed
    (set(WIDTHS), 8, [1, 2, 4, 8]),
    ({2, 4, 8}, 0, [1]),
])
def test_the_widest_win_is_the_last_of_the_wins_from_the_narrowest(monkeypatch, winning, expected, timed):
    assert sweep(widest_win, monkeypatch, winning) == (expected, timed)


def test_a_probe_shape_is_nn_linears_in_features_then_out_features():
    shape = LinearShape(896, 4864)
    assert (shape.in_features, shape.out_features) == tuple(shape)
    assert torch.nn.Linear(*shape, device="meta").weight.shape == (shape.out_features, shape.in_features)



@pytest.mark.parametrize("winning, expected, timed", [
    ({2, 4}, (2, 4), [1, 2, 4, 8]),  # from its first win to the last of the run after it
    ({2, 8}, (2, 2), [1, 2, 4]),  # a win past a loss does not count, nor is it timed
    ({8}, (8, 8), [1, 2, 4, 8]),
    (set(WIDTHS), (1, 8), [1, 2, 4, 8]),
    (set(), None, [1, 2, 4, 8]),
])
def test_the_winning_span_runs_from_the_first_win_to_the_first_loss_after_it(monkeypatch, winning, expected, timed):
    assert sweep(winning_span, monkeypatch, winning) == (expected, timed)


def test_on_cuda_a_width_is_captured_at_its_first_call_and_replayed_after(monkeypatch):
    captured, ran = [], []

    def capture(run, device):  # cuda_graph.replayed's stand-in: what it returns replays the capture
        captured.append(device)
        return run

    monkeypatch.setattr(timing, "replayed", capture)
    product = timing.as_replayed(lambda rows: ran.append(rows), CUDA)
    for rows in (4, 4, 16, 4):
        product(rows)
    assert captured == [CUDA, CUDA] and ran == [4, 4, 16, 4]  # a capture a width
    assert timing.as_replayed(len, CPU) is len  # elsewhere the product itself
