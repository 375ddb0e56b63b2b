"""Making a tap record's line (parse, classify, scrub, serialise) in a process of its own.

The scrubber is a row of regular expressions, and Python's `re` holds the GIL for the whole of one
substitution: run on a thread of the tap's own process, each 20 KB record stalled the proxy's event
loop for milliseconds at a time (a token-like run of 20 KB, for the e-mail pattern's backtracking,
for a second), and the writer fell behind the requests it was meant to record. In a child process
it costs the request path nothing, and the parent can bound it: a record the child has not made
within its time limit is given up (counted) and the child is replaced, so one pathological text
never stops the recording. A record is never written unscrubbed.

The child also remembers the scrubbed form of the texts it has seen (bounded in characters):
a multi-turn or agentic client sends the whole conversation again with every request, so all but
its newest messages were scrubbed before.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

from curator.tap.record import Exchange, Unreadable, build_record, classify_input, parse_request

MEMO_MIN_CHARS = 64  # shorter texts cost less to scrub again than to look up and keep
MEMO_CHARS = 32 * 1024 * 1024  # characters (keys and values) the memo may hold
LIMIT_S = 2.0  # time a record may take, plus LIMIT_S_PER_MB per MB of its request and answer
LIMIT_S_PER_MB = 4.0
START_S = 60.0  # the scrub process's start-up (imports) on a busy machine


@dataclass
class Made:
    """What became of one exchange: `line` (one JSON line) unless it was `unreadable`, `capped` (its
    category was full) or `error` (a record this module could not make; the message)."""

    line: bytes | None = None
    category: str | None = None
    complete: bool = True
    unreadable: bool = False
    capped: bool = False
    error: str | None = None


class Memo:
    """`scrub` with the results of texts of MEMO_MIN_CHARS or more kept, least recently used out first."""

    def __init__(self, scrub: Callable[[str], str], max_chars: int = MEMO_CHARS) -> None:
        self.scrub = scrub
        self.max_chars = max_chars
        self.chars = 0
        self.hits = 0
        self._kept: OrderedDict[str, str] = OrderedDict()

    def __call__(self, text: str) -> str:
        if len(text) < MEMO_MIN_CHARS:
            return self.scrub(text)
        out = self._kept.get(text)
        if out is not None:
            self._kept.move_to_end(text)
            self.hits += 1
            return out
        out = self.scrub(text)
        size = len(text) + len(out)
        if size <= self.max_chars:
            self._kept[text] = out
            self.chars += size
            while self.chars > self.max_chars:
                old, old_out = self._kept.popitem(last=False)
                self.chars -= len(old) + len(old_out)
        return out


def make_line(exchange: Exchange, scrub: Callable[[str], str], *, categorize: bool = False,
              full: Collection[str] = ()) -> Made:
    """Return the record line of one exchange; with `categorize`, its traffic category too, and no
    line when that category is one of `full`."""
    try:
        request = parse_request(exchange.request)
        category = None
        if categorize:
            from curator.traffic.classify import classify

            category = classify(*classify_input(exchange.endpoint, request)).category
            if category in full:
                return Made(category=category, capped=True)
        record = build_record(exchange, request, scrub)
    except Unreadable:
        return Made(unreadable=True)
    except Exception as exc:  # a record this module cannot make is counted; the tap goes on
        return Made(error=f"{type(exc).__name__}: {exc}")
    # a lone surrogate becomes its JSON escape
    line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "backslashreplace")
    return Made(line=line, category=category, complete=record["complete"])


def limit_s(exchange: Exchange) -> float:
    """The time one exchange's record may take before it is given up."""
    size = len(exchange.request) + sum(len(c) for c in exchange.chunks)
    return LIMIT_S + LIMIT_S_PER_MB * size / 1e6


def _serve(conn: Connection, scrub: Callable[[str], str], memo_chars: int) -> None:
    """The child's loop: (exchange, categorize, full) in, Made out, until the parent closes its end."""
    memo = Memo(scrub, memo_chars)
    conn.send("ready")
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        exchange, categorize, full = item
        conn.send(make_line(exchange, memo, categorize=categorize, full=full))


class TimedOut(Exception):
    """The child did not make the record within its limit: it was killed."""


class MakerProcess:
    """A child process making record lines, started on first use and replaced after a time-out or a crash.

    The child is `python -m curator.tap.maker`, not a multiprocessing child: multiprocessing's
    spawn runs the parent's main script again in the child (an unguarded script, or one that
    starts servers, would do it twice), and its fork would copy the proxy's threads mid-lock. It
    runs in a session of its own, so a Ctrl-C at the terminal reaches the tap alone, which then
    has the queued records made before it stops; it exits when the tap's end of the socket closes,
    however the tap ended. `scrub` must be a module-level function: the child imports it by name."""

    def __init__(self, scrub: Callable[[str], str], *, memo_chars: int = MEMO_CHARS, name: str = "curator-tap-scrub") -> None:
        module, qualname = getattr(scrub, "__module__", None), getattr(scrub, "__qualname__", "")
        if not module or "<" in qualname:
            raise ValueError(f"the scrub function must be importable by name, not {scrub!r}")
        self.scrub_ref = f"{module}:{qualname}"
        self.memo_chars = memo_chars
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self.restarts = 0

    def _start(self) -> Connection:
        ours, theirs = socket.socketpair()
        # the child imports what this process can: its search path, the test's or the user's own modules included
        path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        env = {**os.environ, "PYTHONPATH": path}
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", "curator.tap.maker", str(theirs.fileno()), self.scrub_ref,
                                           str(self.memo_chars)], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, env=env, start_new_session=True)
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        # its start-up (imports) is not the first record's time
        if not self._conn.poll(START_S) or self._conn.recv() != "ready":
            raise OSError(f"the scrub process did not start within {START_S:.0f} s")
        return self._conn

    def make(self, exchange: Exchange, *, categorize: bool = False, full: Collection[str] = (),
             limit: float | None = None) -> Made:
        """Return the child's Made for `exchange`; raise TimedOut (the child killed) past `limit` seconds."""
        limit = limit_s(exchange) if limit is None else limit
        try:
            conn = self._conn or self._start()
            conn.send((exchange, categorize, frozenset(full)))
            deadline = time.monotonic() + limit
            while not conn.poll(max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    self.kill()
                    raise TimedOut(f"a record took over {limit:.1f} s to scrub")
            made: Made = conn.recv()
            return made
        except (EOFError, OSError) as exc:  # the child died (killed from outside, out of memory) or never started
            self.kill()
            return Made(error=f"scrub process died: {exc or type(exc).__name__}")

    def kill(self) -> None:
        """Stop the child at once; the next record starts a new one."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
            self.restarts += 1

    def close(self) -> None:
        """Let the child finish and exit."""
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def _import(ref: str) -> Callable[[str], str]:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return cast(Callable[[str], str], obj)


if __name__ == "__main__":  # the child: python -m curator.tap.maker FD MODULE:FUNCTION MEMO_CHARS
    from curator.tap.maker import _import as _find, _serve as _loop  # Made pickled as curator.tap.maker.Made, not __main__.Made

    _loop(Connection(int(sys.argv[1])), _find(sys.argv[2]), int(sys.argv[3]))
