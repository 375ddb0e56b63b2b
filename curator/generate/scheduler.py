"""Least-loaded dispatch over endpoints, each with its own number of request slots.

Every request holds one slot of one endpoint while it is in flight, so an endpoint never sees
more than its `--concurrency` and the slots of all endpoints are what keeps them saturated. A
slot is a stable index, so a caller can keep one connection per slot (no pool contention).
Runs on one event loop; no locks are needed because nothing here awaits between check and take.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lease:
    """One slot of one endpoint, held for the duration of one request."""

    endpoint: str
    slot: int


@dataclass
class _Load:
    capacity: int
    free: list[int] = field(default_factory=list)
    dispatched: int = 0

    @property
    def in_flight(self) -> int:
        return self.capacity - len(self.free)


class Scheduler:
    """Hands out slots of the least-loaded endpoint; callers wait when every slot is taken."""

    def __init__(self, capacities: Mapping[str, int]) -> None:
        if not capacities:
            raise ValueError("a scheduler needs at least one endpoint")
        self._loads = {}
        for name, cap in capacities.items():
            if cap < 1:
                raise ValueError(f"endpoint {name} needs a capacity of at least 1, not {cap}")
            # Popping from the end hands out slot 0 first.
            self._loads[name] = _Load(capacity=cap, free=list(range(cap - 1, -1, -1)))
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def capacity(self) -> int:
        """Return the number of slots over all endpoints."""
        return sum(load.capacity for load in self._loads.values())

    def in_flight(self) -> dict[str, int]:
        """Return the requests in flight per endpoint."""
        return {name: load.in_flight for name, load in self._loads.items()}

    def dispatched(self) -> dict[str, int]:
        """Return how many leases each endpoint has handed out."""
        return {name: load.dispatched for name, load in self._loads.items()}

    async def acquire(self, prefer: str | None = None, avoid: str | None = None) -> Lease:
        """Return a slot: on `prefer` when it has one free (prefix-cache locality for the next
        turn of a conversation), else on the least-loaded endpoint other than `avoid` (one that
        just failed), else on `avoid`; wait while every slot is taken."""
        while True:
            name = self._pick(prefer, avoid)
            if name is not None:
                load = self._loads[name]
                load.dispatched += 1
                return Lease(name, load.free.pop())
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # A wake-up handed to a cancelled waiter must not be lost.
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()
                raise

    def release(self, lease: Lease) -> None:
        """Give the slot back and wake one waiter."""
        self._loads[lease.endpoint].free.append(lease.slot)
        self._wake_one()

    @asynccontextmanager
    async def lease(self, prefer: str | None = None, avoid: str | None = None) -> AsyncIterator[Lease]:
        """Hold a slot for the body of an `async with`."""
        lease = await self.acquire(prefer, avoid)
        try:
            yield lease
        finally:
            self.release(lease)

    def _pick(self, prefer: str | None, avoid: str | None) -> str | None:
        if prefer in self._loads and prefer != avoid and self._loads[prefer].free:
            return prefer
        best: str | None = None
        best_key: tuple[bool, float, int] | None = None
        for name, load in self._loads.items():
            if not load.free:
                continue
            key = (name == avoid, load.in_flight / load.capacity, load.in_flight)
            if best_key is None or key < best_key:
                best, best_key = name, key
        return best

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
