"""Deterministic sampling: every row gets a seeded random key; a source's sample is the walk
through its rows in key order until the quota of good, new rows is met.

Why sample *before* dedup, lazily: a source can hold millions of rows, and only the rows
the walk reaches are normalised, filtered and deduplicated. A duplicate or filtered row is
simply passed over and the walk goes on, so the quota is met whenever the source has
enough good rows, and every count in the manifest is exact for the rows walked. Only the
lowest-keyed `capacity` rows are held at once (bottom-k); if the walk runs past them, the
source is read again for the next lowest keys.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def row_key(seed: int, source: str, index: int) -> int:
    """Return the 64-bit sampling key of row `index` of `source` under `seed`."""
    return int.from_bytes(hashlib.blake2b(f"{seed}\x00{source}\x00{index}".encode(), digest_size=8).digest(), "big")


@dataclass
class Batch(Generic[T]):
    """The lowest-keyed rows above a key, in key order, and whether more rows lie beyond them."""

    items: list[tuple[int, int, T]]  # (key, index, examined row)
    more: bool
    read: int


def lowest_keys(
    rows: Iterable[object],
    key: Callable[[int], int],
    examine: Callable[[int, object], T],
    capacity: int,
    above: tuple[int, int] | None = None,
    on_read: Callable[[int], None] | None = None,
) -> Batch[T]:
    """Return the `capacity` rows with the lowest (key, index) above `above`, examined, in key order.

    Rows that cannot make the cut are not examined (normalising them would be wasted work).
    """
    heap: list[tuple[int, int, T]] = []  # max-heap by (key, index) through negation
    more = False
    read = 0
    for index, row in enumerate(rows):
        read += 1
        if on_read is not None and read % 1000 == 0:
            on_read(read)
        k = key(index)
        if above is not None and (k, index) <= above:
            continue
        if len(heap) >= capacity:
            more = True
            top_key, top_index = -heap[0][0], -heap[0][1]
            if (k, index) >= (top_key, top_index):
                continue
            heapq.heapreplace(heap, (-k, -index, examine(index, row)))
        else:
            heapq.heappush(heap, (-k, -index, examine(index, row)))
    if on_read is not None:
        on_read(read)
    items = sorted(((-k, -i, v) for k, i, v in heap), key=lambda t: (t[0], t[1]))
    return Batch(items, more, read)


def walk(
    open_rows: Callable[[], Iterator[object]],
    key: Callable[[int], int],
    examine: Callable[[int, object], T],
    capacity: int,
    on_read: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, T]]:
    """Yield (index, examined row) for every row of a source in key order, reading it again as needed.

    The caller stops iterating once its quota is met. `on_read` gets the running count of
    rows read during the first pass (the source's size, or its scan limit).
    """
    above: tuple[int, int] | None = None
    first = True
    while True:
        batch = lowest_keys(open_rows(), key, examine, capacity, above, on_read if first else None)
        first = False
        for k, index, value in batch.items:
            yield index, value
        if not batch.more or not batch.items:
            return
        last = batch.items[-1]
        above = (last[0], last[1])
