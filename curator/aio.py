"""Small asyncio helpers shared by the commands that run an event loop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cancel_on_sigterm() -> Iterator[None]:
    """While the block runs, SIGTERM (a scheduler, `kill`) cancels the current task, as Ctrl-C
    does, so every `finally` runs (rows flushed, status written) instead of the process dying with
    work in memory; the handler is removed on exit. Enter it inside the task to cancel. Off the
    main thread (a caller running the loop in a thread) it does nothing: that caller's own
    signal handling applies."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("cancel_on_sigterm() must be entered inside a task")
    try:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    except (ValueError, RuntimeError, NotImplementedError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
