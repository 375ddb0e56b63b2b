"""SIGTERM read as Ctrl-C, for the commands that run without an event loop of their own.

A scheduler or `kill` sends SIGTERM; Python's default is to die at once, losing whatever a stage
holds in memory (hidden-states buffers a shard's samples). Raising KeyboardInterrupt instead runs
every `finally` (the buffer written, the lock released), and the CLI exits 130 as for Ctrl-C.
The asyncio commands use `curator.aio.cancel_on_sigterm` for the same.

Python runs a signal handler only between bytecodes of the main thread: one long call into C (a
forward pass over 200,000 positions, a tokenizer over megabytes) would hold the KeyboardInterrupt
back for minutes, and a C call that keeps the GIL stops every Python thread too. So the block also
starts a small watchdog process, sent each signal's number through `signal.set_wakeup_fd` (which the
C-level handler writes at once, GIL or not): when the block has not ended `GRACE_S` seconds after
SIGTERM, the watchdog says so on stderr and kills the process (SIGKILL). Every store and shard is
written atomically and locks are the kernel's, so what that loses is the work since the last flush,
which a rerun redoes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

GRACE_S = 15.0  # long enough to write a buffered shard, short enough for a scheduler's stop


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


# The watchdog: reads signal numbers from the pipe; after a SIGTERM, waits `grace` seconds for the pipe
# to close (the block ended, or the process died) and else kills the process. It ignores SIGINT and
# SIGTERM itself: a terminal's Ctrl-C or a kill of the whole group must leave it to do its work.
_WATCH = """
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd, pid, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
while True:
    data = os.read(fd, 64)
    if not data:
        sys.exit(0)
    if signal.SIGTERM in data:
        break
deadline = time.monotonic() + grace
while (left := deadline - time.monotonic()) > 0:
    if select.select([fd], [], [], left)[0] and not os.read(fd, 64):
        sys.exit(0)
os.write(2, ("interrupted: still running %g s after SIGTERM; killed\\n" % grace).encode())
os.kill(pid, signal.SIGKILL)
"""


class _Watchdog:
    """Kills this process `grace_s` after a SIGTERM unless `close` comes first (see the module doc)."""

    def __init__(self, grace_s: float) -> None:
        read, self._write = os.pipe()  # neither end is inherited by other children (PEP 446)
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCH, str(read), str(os.getpid()),
                                           str(grace_s)], pass_fds=(read,), stdin=subprocess.DEVNULL)
        except BaseException:
            os.close(self._write)
            raise
        finally:
            os.close(read)
        os.set_blocking(self._write, False)  # set_wakeup_fd needs a non-blocking descriptor
        self.previous: int | None = None

    def listen(self) -> None:
        """Have the C-level signal handler write every signal's number to the watchdog."""
        self.previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def arm(self) -> None:
        """Start the grace period now (for an event loop that received SIGTERM itself)."""
        try:
            os.write(self._write, bytes([signal.SIGTERM]))
        except OSError:  # closed already, or the pipe full of earlier signals: it is armed either way
            pass

    def close(self) -> None:
        if self.previous is not None:
            signal.set_wakeup_fd(self.previous)
        os.close(self._write)  # the watchdog reads the end of the pipe and leaves
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@contextmanager
def sigterm_as_ctrl_c(grace_s: float | None = None) -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt in the main thread, and the process is
    killed `grace_s` (default GRACE_S) seconds later if the block has not ended by then; the old handler
    comes back on exit. Off the main thread it does nothing (signals reach the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _interrupt)
    # An event loop running here already owns the wakeup descriptor (and stays responsive): no watchdog.
    current = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(current)
    watchdog = _Watchdog(GRACE_S if grace_s is None else grace_s) if current == -1 else None
    try:
        if watchdog is not None:
            watchdog.listen()
        yield
    finally:
        if watchdog is not None:
            watchdog.close()
        signal.signal(signal.SIGTERM, before)


@contextmanager
def kill_after_sigterm(grace_s: float | None = None) -> Iterator[Callable[[], None]]:
    """For a command whose event loop takes SIGTERM itself (it cancels its task): yields `arm`, which its
    handler calls; the process is killed `grace_s` (default GRACE_S) seconds later unless the block has
    ended (asyncio.run waits for its worker threads: one inside a minutes-long model call would hold
    the stop). Off the main thread `arm` does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    watchdog = _Watchdog(GRACE_S if grace_s is None else grace_s)
    try:
        yield watchdog.arm
    finally:
        watchdog.close()
