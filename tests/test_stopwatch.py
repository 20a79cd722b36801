"""stopwatch.py: the seconds inside its blocks add up; those between them are left out."""

from specchat import stopwatch
from specchat.stopwatch import Stopwatch


def test_a_stopwatch_adds_the_seconds_inside_its_blocks_alone(monkeypatch):
    readings = iter([1.0, 3.0, 10.0, 10.5])  # in at 1, out at 3; 7 s outside; in at 10, out at 10.5
    monkeypatch.setattr(stopwatch, "perf_counter", lambda: next(readings))
    watch = Stopwatch()
    for _ in range(2):
        with watch:
            pass
    assert watch.seconds == 2.5
