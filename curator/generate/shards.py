"""The generation output directory: immutable JSONL shards, the errors file, run metadata.

Exactly-once comes from one rule: a record counts as done only once it is inside a shard that
was renamed into place whole (written to a temporary name in the same directory, fsynced,
then os.replace). A shard is never touched again, and a new run skips every id found in one.
So a crash at any instant, SIGKILL included, loses only the buffered records (at most
`max_age_s` of work), which the next run simply does again; no id can be written twice.

errors.jsonl is appended line by line (a crash can leave a torn last line, which is counted and
skipped) and rewritten whole, atomically, at the start and end of every run, keeping one line
per id that is still failed and not in a shard. It is written ASCII-escaped, so an error text
holding anything (a lone surrogate from a server) is stored as it came.

A record is encoded when it is queued, so one answer that cannot be stored as UTF-8 (a lone
surrogate) is refused on its own (UnstorableRecord) and never costs the shard it would have joined.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from curator.errors import ConfigError
from curator.http import redact
from training.io import atomic
from training.io.diskspace import named_disk_full
from training.io.outlock import OutputBusyError
from training.io.outlock import OutputLock as _Lock
from training.records.gen_shards import shard_index, record_lines, shard_name, shard_paths

ERRORS_FILE = "errors.jsonl"
META_FILE = "generation.json"
LOCK_FILE = ".generate.lock"
TMP_MARK = atomic.TMP_MARK


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part."""
    atomic.write_bytes(path, data)
    atomic.fsync_path(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON to `path`, atomically."""
    write_atomic(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode())


class UnstorableRecord(ValueError):
    """A record whose text cannot be written as UTF-8 JSON (a lone surrogate)."""


def encode_record(record: dict[str, Any]) -> bytes:
    """Return the record's shard line (UTF-8 JSON); UnstorableRecord when its text is not valid Unicode."""
    try:
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnstorableRecord(f"text is not valid Unicode ({exc.reason} at position {exc.start})") from None


def _error_lines(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode("ascii")


@dataclass
class ShardScan:
    """What the finished shards hold."""

    done_ids: set[str] = field(default_factory=set)
    records: int = 0
    malformed_lines: int = 0
    duplicate_ids: int = 0
    next_index: int = 0


def scan_shards(out_dir: str | Path) -> ShardScan:
    """Return the ids already generated in `out_dir` (and counts of anything odd in the shards)."""
    scan = ShardScan()
    for path in shard_paths(out_dir):
        if (index := shard_index(path.name)) is not None:  # always: shard_paths lists shards only
            scan.next_index = max(scan.next_index, index + 1)
        for record in record_lines(path):
            if record is None:
                scan.malformed_lines += 1
                continue
            row_id = record.get("id")
            if not isinstance(row_id, str):
                scan.malformed_lines += 1
                continue
            if row_id in scan.done_ids:
                scan.duplicate_ids += 1
            scan.done_ids.add(row_id)
            scan.records += 1
    return scan


def remove_stale_temporaries(out_dir: Path) -> int:
    """Delete temporary files a killed run left behind; return how many."""
    removed = 0
    for path in out_dir.iterdir():
        if path.name.startswith(".") and TMP_MARK in path.name:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


class ShardWriter:
    """Buffers finished records and writes them as the next shard when `max_rows` are waiting
    or the oldest has waited `max_age_s` (call `flush_if_due` from a timer for quiet spells)."""

    def __init__(self, out_dir: str | Path, next_index: int, *, max_rows: int = 1000, max_age_s: float = 30.0) -> None:
        self.out_dir = Path(out_dir)
        self.next_index = next_index
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self.written = 0
        self.shards_written = 0
        self._buffer: list[bytes] = []
        self._oldest: float | None = None

    def add(self, record: dict[str, Any]) -> None:
        """Queue a record (UnstorableRecord, and nothing queued, when it cannot be encoded); it is
        durable once the shard holding it is flushed."""
        line = encode_record(record)
        if self._oldest is None:
            self._oldest = time.monotonic()
        self._buffer.append(line)
        if len(self._buffer) >= self.max_rows:
            self.flush()
        else:
            self.flush_if_due()

    def flush_if_due(self) -> None:
        """Flush when the oldest buffered record has waited `max_age_s`."""
        if self._oldest is not None and time.monotonic() - self._oldest >= self.max_age_s:
            self.flush()

    def flush(self) -> None:
        """Write the buffered records as one new shard (nothing when the buffer is empty)."""
        if not self._buffer:
            return
        path = self.out_dir / shard_name(self.next_index)
        write_atomic(path, b"".join(self._buffer))
        self.next_index += 1
        self.shards_written += 1
        self.written += len(self._buffer)
        self._buffer = []
        self._oldest = None

    @property
    def pending(self) -> int:
        """Return how many records wait in memory."""
        return len(self._buffer)


class ErrorLog:
    """errors.jsonl: one record per id that failed for good, with the reason and status."""

    def __init__(self, out_dir: str | Path) -> None:
        # Appended to with open(.., "a"), which writes through a link: one planted there is refused
        # (OutputPathError) before the file is read or written.
        self.path = atomic.output_file(out_dir, ERRORS_FILE)
        self.records: dict[str, dict[str, Any]] = {}
        self.malformed_lines = 0
        self._fh: IO[str] | None = None

    def load(self) -> dict[str, dict[str, Any]]:
        """Read the file (the last line per id wins; torn lines are counted); return the records."""
        self.records = {}
        if self.path.exists():
            malformed = 0
            for record in record_lines(self.path):
                if record is not None and isinstance(record.get("id"), str):
                    self.records[record["id"]] = record
                else:
                    malformed += 1
            self.malformed_lines = malformed
        return self.records

    def compact(self, done_ids: set[str]) -> None:
        """Rewrite the file atomically without ids that are done (or duplicated, or torn)."""
        self.close()
        for row_id in [i for i in self.records if i in done_ids]:
            del self.records[row_id]
        if self.records or self.path.exists():
            write_atomic(self.path, _error_lines(self.records.values()))

    def add(self, record: dict[str, Any]) -> None:
        """Append one failure and push it to disk (failures are rare; losing one is worse). Its
        texts are redacted: an error may quote a server that echoed the run's key back."""
        record = {k: redact(v) if isinstance(v, str) and k != "id" else v for k, v in record.items()}
        with named_disk_full(self.path.parent):
            if self._fh is None:
                self._fh = open(self.path, "a", encoding="ascii")
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        self.records[record["id"]] = record

    def close(self) -> None:
        """Close the append handle."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class OutputLock:
    """The output directory's lock (.generate.lock, naming the PID), so two runs never write the same
    shards; the kernel drops it when the process dies, SIGKILL included, and a finished run removes it."""

    def __init__(self, out_dir: Path) -> None:
        self._lock = _Lock(out_dir, LOCK_FILE, "`curator generate`")
        self.path = self._lock.path

    def __enter__(self) -> OutputLock:
        try:
            self._lock.acquire()
        except OutputBusyError as exc:
            raise ConfigError(str(exc)) from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
