"""Host seconds spent inside `with` blocks, added up: plain readings of the host's clock, with no
device synchronize (device_clock.py's clock is the synchronized one)."""

from time import perf_counter


class Stopwatch:
    """Seconds spent inside its `with` blocks, added up. Around work that ends by bringing the
    device's results to the host (a `.cpu()`), it needs no synchronize: what lies outside the
    blocks is the host's own time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.started = 0.0

    def __enter__(self) -> "Stopwatch":
        self.started = perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += perf_counter() - self.started
