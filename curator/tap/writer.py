"""The tap's writer: records leave the request path through a bounded queue to a thread that has a
child process scrub them and sample them by category (curator/tap/maker.py: off the proxy's GIL,
each record bounded in time), then appends them to size-rotated JSONL files bounded in total disk.

Each record is one `os.write` of one whole line to a file opened O_APPEND, and the batch it
belongs to (whatever the queue held, at most `batch` records) is fsynced before the next: a
SIGKILL loses at most the records in flight and never tears one already written. A write that
fails (a full disk, an I/O error) is cut back to the file's length before it, so no torn line is
left either, and recording pauses for `retry_s` (the records meanwhile are counted, not written);
requests never wait for any of it. A full queue drops the record and counts it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from curator.tap.maker import MakerProcess, Memo, TimedOut, make_line
from curator.tap.record import Exchange, utc_iso

PREFIX = "tap-"
SUFFIX = ".jsonl"
LOCK_NAME = ".tap.lock"


class TapLog:
    """The tap's files in one folder: `tap-<UTC time>.jsonl`, a new one past `max_file_bytes`, the
    oldest removed while all of them pass `max_total_bytes`."""

    def __init__(self, folder: str | Path, *, max_file_bytes: int, max_total_bytes: int, fsync: bool = True) -> None:
        if max_file_bytes <= 0 or max_total_bytes < max_file_bytes:
            raise ValueError("max_file_bytes must be positive and at most max_total_bytes")
        self.folder = Path(folder)
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.fsync = fsync
        self.path: Path | None = None
        self._fd: int | None = None
        self._size = 0
        self.removed = 0  # files removed for the disk bound
        self.bytes_written = 0

    def files(self) -> list[Path]:
        """The tap's files, oldest first (names sort by time)."""
        return sorted(p for p in self.folder.glob(f"{PREFIX}*{SUFFIX}") if p.is_file())

    def _open_new(self) -> None:
        self.close()
        stamp = utc_iso(time.time()).replace(":", "").replace("-", "").replace(".", "")
        path = self.folder / f"{PREFIX}{stamp}{SUFFIX}"
        n = 1
        while path.exists():  # two files in one microsecond: the second gets a suffix that still sorts after it
            path = self.folder / f"{PREFIX}{stamp}-{n}{SUFFIX}"
            n += 1
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.path, self._size = path, 0
        self._bound()

    def _bound(self) -> None:
        """Remove the oldest files (never the one being written) while the folder holds too much."""
        files = self.files()
        sizes = {p: p.stat().st_size for p in files}
        total = sum(sizes.values())
        for old in files:
            if total <= self.max_total_bytes - self.max_file_bytes or old == self.path:
                break  # room left for the current file to grow to its full size
            old.unlink(missing_ok=True)
            total -= sizes[old]
            self.removed += 1

    def write(self, lines: list[bytes]) -> None:
        """Append whole lines (each ends in a newline), then fsync. On an OSError the file is cut back to
        what it held before the failed line, and the error is raised."""
        for line in lines:
            if self._fd is None or (self._size and self._size + len(line) > self.max_file_bytes):
                self._open_new()
            assert self._fd is not None
            try:
                written = os.write(self._fd, line)
                if written != len(line):  # a short write is a full disk that said so late
                    raise OSError(28, "No space left on device (short write)")
            except OSError:
                try:
                    os.ftruncate(self._fd, self._size)  # the line is written whole or not at all
                except OSError:
                    pass
                raise
            self._size += len(line)
            self.bytes_written += len(line)
        if self.fsync and self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class TapWriter:
    """The queue, the threads and the scrub processes between the proxy and a TapLog. `submit` never blocks.

    Each of `processes` lanes is a thread that takes a batch from the queue, has its own child
    process make the records (curator/tap/maker.py: off the proxy's GIL, bounded in time) and
    appends them to the log. `processes=0` makes them on the lane's thread instead (one lane)."""

    def __init__(self, log: TapLog, *, scrub: Callable[[str], str], caps: Mapping[str, int] | None = None,
                 queue_size: int = 1024, batch: int = 64, retry_s: float = 30.0, processes: int = 1,
                 limit_s: float | None = None) -> None:
        if processes < 0:
            raise ValueError("processes must be 0 or more")
        self.log = log
        self.scrub = scrub
        self.caps = dict(caps or {})
        self.batch = batch
        self.retry_s = retry_s
        self.limit_s = limit_s  # None: maker.limit_s, by the record's size
        self.stats: Counter[str] = Counter()
        self.per_category: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._queue: queue.Queue[Exchange | None] = queue.Queue(maxsize=queue_size)
        self._paused_until = 0.0
        self.last_error: str | None = None
        self._memo = Memo(scrub) if processes == 0 else None
        self._makers = [MakerProcess(scrub, name=f"curator-tap-scrub-{n}") for n in range(processes)]
        self._threads = [threading.Thread(target=self._run, args=(maker,), name=f"curator-tap-writer-{n}", daemon=True)
                         for n, maker in enumerate(self._makers or [None])]

    def start(self) -> TapWriter:
        for thread in self._threads:
            thread.start()
        return self

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def submit(self, exchange: Exchange) -> None:
        """Hand one exchange to the writer; a full queue drops it (counted)."""
        try:
            self._queue.put_nowait(exchange)
        except queue.Full:
            self.count("dropped_queue_full")

    def snapshot(self) -> dict[str, Any]:
        """The counters, the records per category, the files and the last write error, for /tap/stats and the console."""
        with self._lock:
            out: dict[str, Any] = dict(self.stats)
            out["per_category"] = dict(self.per_category)
        out.update(queued=self._queue.qsize(), bytes_written=self.log.bytes_written, files_removed=self.log.removed,
                   file=str(self.log.path) if self.log.path else None, recording=time.monotonic() >= self._paused_until,
                   last_error=self.last_error)
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to `timeout`), then stop the threads and processes and close the file."""
        deadline = time.monotonic() + timeout
        for _ in self._threads:
            try:
                self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                break
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for maker in self._makers:
            if not any(t.is_alive() for t in self._threads):
                maker.close()
            else:  # a lane still busy past the timeout: its child goes now, the thread is a daemon
                maker.kill()
        with self._write_lock:
            self.log.close()

    def _full(self) -> set[str]:
        with self._lock:
            return {c for c, cap in self.caps.items() if self.per_category[c] >= cap}

    def _make(self, exchange: Exchange, maker: MakerProcess | None) -> bytes | None:
        """Return the exchange's line, or None (counted: unreadable, capped, an error, a time-out)."""
        categorize = bool(self.caps)
        if maker is None:
            assert self._memo is not None
            made = make_line(exchange, self._memo, categorize=categorize, full=self._full())
        else:
            try:
                made = maker.make(exchange, categorize=categorize, full=self._full(), limit=self.limit_s)
            except TimedOut as exc:
                self.count("dropped_scrub_timeout")
                self.last_error = str(exc)
                return None
        if made.unreadable:
            self.count("unreadable")
            return None
        if made.error is not None:
            self.count("record_errors")
            self.last_error = made.error
            return None
        if made.category is not None:
            with self._lock:
                cap = self.caps.get(made.category)
                if made.capped or (cap is not None and self.per_category[made.category] >= cap):
                    self.stats["dropped_cap"] += 1
                    return None
                self.per_category[made.category] += 1
        if not made.complete:
            self.count("incomplete")
        return made.line

    def _run(self, maker: MakerProcess | None) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            items = [item]
            while item is not None and len(items) < self.batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                items.append(item)
            stop = items[-1] is None  # one None per lane: this lane takes its own and no more
            exchanges = [e for e in items if e is not None]
            if not exchanges:
                continue
            if time.monotonic() < self._paused_until:
                self.count("dropped_write_error", len(exchanges))
                continue
            lines = [line for line in (self._make(e, maker) for e in exchanges) if line is not None]
            if not lines:
                continue
            with self._write_lock:
                try:
                    self.log.write(lines)
                except OSError as exc:
                    self._paused_until = time.monotonic() + self.retry_s
                    self.count("dropped_write_error", len(lines))
                    self.count("write_errors")
                    self.last_error = f"{exc.strerror or exc} (recording paused {self.retry_s:g} s)"
                    continue
            self.count("recorded", len(lines))
