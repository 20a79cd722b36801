"""A transfer link of a given speed that moves nothing (the streamer's and expert units' stand-in), and a
storage whose reads return at once (the transport's)."""

from specchat.transfer import TransferStats


class VirtualLink:
    """A link that copies one layer at a time in `copy_s` of virtual time; compute advances the
    same clock. Deterministic: the schedule alone decides the total. The clock starts at `START`,
    not 0, so that a duration taken as a sum of two readings, not their difference, shows."""

    START = 17.0

    def __init__(self, copy_s: float) -> None:
        self.copy_s = copy_s
        self.now = self.START
        self.link_free = self.START

    def begin(self, layer, slot, whole=False):
        start = max(self.now, self.link_free)
        self.link_free = start + self.copy_s
        return self.link_free

    def finish(self, ticket):
        self.now = max(self.now, ticket)

    def retire(self, slot):
        pass

    def stats(self):
        return TransferStats()


class InstantStore:
    """A storage whose reads return at once: a layer's bytes are its staging buffer as it is."""

    def __init__(self, nbytes: int) -> None:
        self.size = nbytes

    def read_run(self, layers, stagings):
        return stagings

    def follows(self, previous, layer):
        return False

    def nbytes(self, layer):
        return self.size
