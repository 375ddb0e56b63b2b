"""The tap in front of the fake engine, on its own thread and event loop, on free ports."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from curator.tap.proxy import TapProxy
from curator.tap.writer import TapLog, TapWriter
from curator.traffic.scrub import scrub
from tests.curator.tap.fake_engine import FakeEngine


class RunningTap:
    def __init__(self, proxy: TapProxy, writer: TapWriter | None) -> None:
        self.proxy = proxy
        self.writer = writer
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        proxy._on_listen = self._listening
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _listening(self, host: str, port: int) -> None:
        self.port = port
        self._ready.set()

    def _run(self) -> None:
        self._task = self._loop.create_task(self.proxy.serve("127.0.0.1", 0))
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RunningTap:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        assert self._task is not None
        self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
        if self.writer is not None:
            self.writer.close()

    def flush(self, n: int, timeout: float = 10.0) -> None:
        """Wait until the writer has dealt with `n` exchanges (written, dropped or refused)."""
        assert self.writer is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.writer.snapshot()
            done = sum(s.get(k, 0) for k in ("recorded", "dropped_queue_full", "dropped_write_error", "dropped_cap", "unreadable", "record_errors"))
            if done >= n and s["queued"] == 0:
                return
            time.sleep(0.01)
        raise AssertionError(f"writer did not catch up: {self.writer.snapshot()}")


def records(folder: Path) -> list[dict[str, Any]]:
    """Every record of the tap's files, oldest file first."""
    out = []
    for path in sorted(folder.glob("tap-*.jsonl")):
        out += [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return out


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    with FakeEngine() as e:
        yield e


@pytest.fixture
def make_tap(tmp_path: Path) -> Iterator[Callable[..., RunningTap]]:
    started: list[RunningTap] = []

    def make(engine_url: str, *, log: TapLog | None = None, rate: float = 1.0, caps: dict[str, int] | None = None,
             queue_size: int = 1024, record: bool = True) -> RunningTap:
        writer = None
        if record:
            log = log or TapLog(tmp_path / "tap", max_file_bytes=1 << 20, max_total_bytes=8 << 20)
            log.folder.mkdir(parents=True, exist_ok=True)
            writer = TapWriter(log, scrub=scrub, caps=caps, queue_size=queue_size, retry_s=3600).start()
        tap = RunningTap(TapProxy(engine_url, writer, rate=rate, seed=0), writer).start()
        started.append(tap)
        return tap

    yield make
    for tap in started:
        tap.stop()
