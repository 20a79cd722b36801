"""The request's `stop` strings over streamed text: emit only text that cannot begin a stop string,
and cut the reply before the first one found."""


class StopScan:
    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""  # held back: a tail that may be the start of a stop string
        self.hit = False
        self.word = ""  # the stop string found

    def push(self, text: str) -> str:
        """The text that is now safe to emit."""
        if self.hit:
            return ""
        buffer = self.pending + text
        found = [(buffer.find(stop), stop) for stop in self.stops if stop in buffer]
        if found:
            at, self.word = min(found)
            self.hit, self.pending = True, ""
            return buffer[:at]
        held = self.held_back(buffer)
        self.pending = buffer[len(buffer) - held:]
        return buffer[:len(buffer) - held]

    def held_back(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that a stop string begins with."""
        return max((size for stop in self.stops for size in range(1, min(len(stop), len(buffer) + 1))
                    if buffer.endswith(stop[:size])), default=0)

    def finish(self) -> str:
        """At the end of the reply: the held-back tail, which no stop string completed."""
        tail, self.pending = self.pending, ""
        return "" if self.hit else tail
