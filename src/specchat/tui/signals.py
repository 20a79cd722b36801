"""SIGTERM as a request to exit, so that a process manager's stop ends the app as /quit does."""

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def exit_on_sigterm(exit: Callable[[], object]) -> Iterator[None]:
    """Call `exit` in the running event loop on SIGTERM, until the block ends."""
    loop, previous = asyncio.get_running_loop(), signal.getsignal(signal.SIGTERM)
    loop.add_signal_handler(signal.SIGTERM, exit)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)  # None: set outside Python
