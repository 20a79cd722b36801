"""The file descriptors this process holds, for tests that a failure closes everything it opened."""

import gc
import os


def held_descriptors() -> set[str]:
    """The descriptors open now, once garbage from earlier tests is collected: an object of theirs
    finalized during a test (a mapped file, say) closed two descriptors held before it, and the
    test read that as its own change. Taken before the work under test, not after it, so that a
    descriptor the work leaves to the collector still counts as left open."""
    gc.collect()
    return set(os.listdir("/proc/self/fd"))


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))
