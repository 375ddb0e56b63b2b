"""The scout's single catalog writer: agents enqueue, one task writes, in order.

DuckDB lets one writer hold the file at a time, and the catalog opens a connection per call,
so concurrent agents must not write it directly. Every write goes through one asyncio queue
and one writer task that runs the (blocking) catalog calls in a worker thread, one batch at a
time over one held connection, batching tool-call log rows into one transaction. Anything enqueued is written even if the
agent that enqueued it is cancelled afterwards; `stop()` drains the queue before returning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from curator.catalog import AgentAccount, Catalog
from curator.errors import CatalogLockedError, CuratorError
from curator.http import redact

T = TypeVar("T")

_STOP = object()


@dataclass
class _Job:
    kind: str  # "tool_call" rows are batched; everything else runs alone
    payload: Any
    future: asyncio.Future | None = None


@dataclass
class SinkStats:
    """What the writer did: rows written per kind and the failures it could not report to a caller."""

    written: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class CatalogSink:
    """The one writer of a scout run's catalog rows."""

    def __init__(
        self, catalog: Catalog, batch_max: int = 100, idle_release_s: float = 0.5, max_hold_s: float = 2.0,
        lock_attempts: int = 3, min_hold_s: float = 0.25,
    ) -> None:
        self.catalog = catalog
        self.min_hold_s = min_hold_s
        self.lock_attempts = lock_attempts
        self.batch_max = batch_max
        self.idle_release_s = idle_release_s
        self.max_hold_s = max_hold_s
        self.stats = SinkStats()
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._datasets_seen: set[tuple[str, str | None]] = set()

    async def start(self) -> None:
        """Start the writer task (idempotent)."""
        if self._task is not None and not self._task.done():
            return
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._writer(), name="catalog-writer")

    async def stop(self) -> None:
        """Write everything enqueued so far, then end the writer task."""
        if self._task is None or self._queue is None:
            return
        if not self._task.done():
            self._queue.put_nowait(_STOP)
            try:
                await asyncio.shield(self._task)
            except asyncio.CancelledError:
                # our caller is being cancelled: still finish the writes before giving up
                await self._task
                raise
        # a writer cancelled from outside may leave work behind: write it here
        leftovers = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not _STOP:
                leftovers.append(item)
        if leftovers:
            await self._write(leftovers)  # one batch, in order, as the writer task would have
        self._task = None

    async def flush(self) -> None:
        """Return once everything enqueued before this call is written."""
        await self.call(lambda catalog: None)

    async def candidate(
        self,
        run_id: str,
        agent: str,
        dataset_id: str,
        category: str,
        relevance: float,
        rationale: str,
        suggested_samples: int,
    ) -> int:
        """Write one candidate row and return its id (waits for the write)."""
        args = (run_id, agent, dataset_id, category, relevance, rationale, suggested_samples)
        return await self.call(lambda catalog: catalog.add_candidate(*args))

    def log_tool_call(
        self,
        run_id: str,
        agent: str,
        turn: int,
        tool: str,
        arguments: dict[str, Any],
        ok: bool,
        result_summary: str,
        error: str | None,
        latency_ms: float,
    ) -> None:
        """Enqueue one audit-log row without suspending (safe to call while a task is being cancelled)."""
        error = redact(error) if error else error  # a server's error body may echo a key
        self._put(_Job("tool_call", (run_id, agent, turn, tool, arguments, ok, result_summary, error, latency_ms)))

    async def dataset(self, info: dict[str, Any]) -> None:
        """Enqueue an upsert of one dataset's Hub metadata (once per dataset revision per run)."""
        self.upsert_dataset(info)

    def upsert_dataset(self, info: dict[str, Any]) -> None:
        """Enqueue an upsert of one dataset's Hub metadata without suspending."""
        key = (str(info.get("dataset_id")), info.get("sha"))
        if key in self._datasets_seen:
            return
        self._datasets_seen.add(key)
        self._put(_Job("dataset", dict(info)))

    async def agent(self, row: AgentAccount) -> None:
        """Enqueue one agent's accounting row (`scout_agents`; insert or replace), its error redacted of keys."""
        if row.error:
            row = dataclasses.replace(row, error=redact(row.error))
        self._put(_Job("agent", row))

    async def call(self, fn: Callable[[Catalog], T]) -> T:
        """Run `fn(catalog)` on the writer, after everything enqueued before; return its result."""
        future = asyncio.get_running_loop().create_future()
        self._put(_Job("call", fn, future))
        return await future

    def _put(self, job: _Job) -> None:
        if self._queue is None or self._task is None:
            raise CuratorError("the catalog sink is not started; call `await sink.start()` first")
        self._queue.put_nowait(job)

    async def _writer(self) -> None:
        assert self._queue is not None
        while True:
            item = await self._queue.get()
            # Hold the file while writes keep coming (opening it costs ~0.1 s a time), but let go
            # when the queue is idle, after max_hold_s, or after min_hold_s when another process
            # waits, so that a person's `curator sql` or a second scout gets its turn.
            session = await self._open_session()
            held_since = time.monotonic()
            try:
                while True:
                    batch = [item]
                    while len(batch) < self.batch_max and not self._queue.empty():
                        batch.append(self._queue.get_nowait())
                    stop = any(job is _STOP for job in batch)
                    await self._write([job for job in batch if job is not _STOP])
                    if stop:
                        return
                    held = time.monotonic() - held_since
                    if held > self.max_hold_s or (held > self.min_hold_s and self.catalog.others_waiting()):
                        break
                    try:
                        item = await asyncio.wait_for(self._queue.get(), self.idle_release_s)
                    except asyncio.TimeoutError:
                        break
            finally:
                session.__exit__(None, None, None)

    async def _open_session(self) -> Any:
        # One process keeping the file past the catalog's wait (a duckdb shell left open) costs
        # this run a few more waits, not its rows: the queue is kept while it tries again.
        attempt = 1
        while True:
            session = self.catalog.session()
            try:
                await asyncio.to_thread(session.__enter__)
                return session
            except CatalogLockedError:
                if attempt >= self.lock_attempts:
                    raise
                attempt += 1

    async def _write(self, batch: list[_Job]) -> None:
        # The whole batch runs in one worker-thread call over one held connection: opening the
        # file per write would cost ~0.1 s each and make agents wait on the writer.
        outcomes = await asyncio.to_thread(self._write_sync, batch)
        for job, (ok, value) in zip(batch, outcomes):
            if job.future is not None and not job.future.done():
                if ok:
                    job.future.set_result(value)
                else:
                    job.future.set_exception(value)

    def _write_sync(self, batch: list[_Job]) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = [(True, None)] * len(batch)
        with self.catalog.session():
            i = 0
            while i < len(batch):
                if batch[i].kind == "tool_call":
                    # consecutive tool-call rows go in one transaction; order with other writes is kept
                    j = i
                    while j < len(batch) and batch[j].kind == "tool_call":
                        j += 1
                    rows = [job.payload for job in batch[i:j]]
                    # _run calls each function at once, so closing over this iteration's values is safe
                    self._run("tool_call", lambda c: c.log_tool_calls(rows), len(rows))
                    i = j
                    continue
                job = batch[i]
                if job.kind == "dataset":
                    outcomes[i] = self._run("dataset", lambda c: c.upsert_dataset(job.payload))
                elif job.kind == "agent":
                    outcomes[i] = self._run("agent", lambda c: c.record_agent(job.payload))
                else:
                    outcomes[i] = self._run("call", job.payload, report=job.future is None)
                i += 1
        return outcomes

    def _run(self, kind: str, fn: Callable[[Catalog], Any], rows: int = 1, report: bool = True) -> tuple[bool, Any]:
        try:
            result = fn(self.catalog)
        except Exception as exc:  # the writer must outlive one bad row; the failure goes to its caller or stats
            if report:
                self.stats.errors.append(f"{kind}: {exc}")
            return False, exc
        self.stats.written[kind] = self.stats.written.get(kind, 0) + rows
        return True, result
