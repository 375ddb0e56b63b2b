"""SIGTERM read as Ctrl-C, for the commands that run without an event loop of their own.

A scheduler or `kill` sends SIGTERM; Python's default is to die at once, losing whatever a stage
holds in memory (hidden-states buffers a shard's samples). Raising KeyboardInterrupt instead runs
every `finally` (the buffer written, the lock released), and the CLI exits 130 as for Ctrl-C.
The asyncio commands use `curator.aio.cancel_on_sigterm` for the same.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt in the main thread; the old handler
    comes back on exit. Off the main thread it does nothing (signals reach the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
