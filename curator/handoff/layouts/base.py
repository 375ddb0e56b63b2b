"""What a trainer's layout is: its files, its layer numbering, its norm convention, its launch line and traps.

A layout is one module of this package and one entry of `LAYOUTS` (curator/handoff/layouts/__init__.py).
Its writer gets the rows in order and writes each into the staging folder through a `FileSink`
(files written by a few threads, each fsynced, so the export streams at disk speed while the next
row is read); the folder is published whole by curator.handoff.export.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from curator.handoff.errors import LayoutCannotHoldError
from curator.handoff.rows import HandoffRow, HandoffSource


@dataclass(frozen=True)
class Trap:
    """A way a run of the trainer on this export goes wrong silently, and what to do."""

    name: str
    message: str


class FileSink:
    """Writes files on a few threads, at most `depth` in flight; each file fsynced before it counts."""

    def __init__(self, workers: int = 4, depth: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="export-data")
        self._pending: list[Future[int]] = []
        self._depth = depth
        self.bytes_written = 0
        self.files = 0

    def submit(self, path: Path, write: Callable[[Path], None]) -> None:
        """Write `path` with `write(path)` on a worker thread (then fsync it)."""
        self._pending.append(self._pool.submit(_write_file, path, write))
        while len(self._pending) > self._depth or (self._pending and self._pending[0].done()):
            self._collect(self._pending.pop(0))

    def _collect(self, future: Future[int]) -> None:
        self.bytes_written += future.result()
        self.files += 1

    def close(self) -> None:
        """Wait for every file (raising the first error)."""
        try:
            for future in self._pending:
                self._collect(future)
        finally:
            self._pending = []
            self._pool.shutdown(wait=True, cancel_futures=True)


def _write_file(path: Path, write: Callable[[Path], None]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def torch_file(tensors: dict[str, Any]) -> Callable[[Path], None]:
    """Return a writer of `tensors` (tensors and plain values only) as torch.save writes them.

    torch.save writes a tensor's whole storage: a row read from a store shard is a view of the shard's
    tensor, which would put the shard into every row's file. Such views are copied to their own storage.
    """
    own = {k: (v.clone() if isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() > v.nbytes else v)
           for k, v in tensors.items()}
    return lambda path: torch.save(own, path)


class LayoutWriter(ABC):
    """Writes one export's rows into the staging folder."""

    def __init__(self, stage: Path, source: HandoffSource, sink: FileSink) -> None:
        self.stage = stage
        self.source = source
        self.sink = sink

    @abstractmethod
    def add(self, index: int, row: HandoffRow) -> None:
        """Write row number `index` (0-based, in export order)."""

    def close(self) -> dict[str, Any]:
        """Finish the files that cover all rows; return what the manifest adds for this layout."""
        return {}


@dataclass(frozen=True)
class Layout(ABC):
    """One trainer's layout."""

    name: str
    trainer: str
    verified: str  # the trainer's version whose own loaders read these files (tests/engines/)
    needs_states: bool
    final_norm: str | None  # "before" / "after" the target's final norm; None: no final state in the files
    layer_offset: int  # trainer's layer id = curator's (an input of layer L) - offset; 1: the trainer counts outputs
    summary: str = ""
    notes: tuple[str, ...] = field(default=())

    def trainer_layer_ids(self, layer_ids: list[int]) -> list[int]:
        """Return the aux layer ids in the trainer's numbering; refused when one has no such name there."""
        ids = [i - self.layer_offset for i in layer_ids]
        if any(i < 0 for i in ids):
            raise LayoutCannotHoldError(
                f"{self.trainer} numbers aux layers by their outputs (curator's id minus 1): id {min(layer_ids)} "
                f"(the embedding output) has no name there; capture other layers for {self.name}")
        return ids

    def check(self, source: HandoffSource) -> None:
        """Refuse data this layout cannot hold, before anything is written."""
        meta = source.meta
        if meta is None:  # a layout that needs states is refused by the export, which knows the alternatives
            return
        if self.final_norm is not None and not meta.has_final:
            raise LayoutCannotHoldError(f"{self.name} needs the final hidden state and {meta.target}'s store keeps none "
                                        "(captured with --no-final); capture again with it")
        if self.final_norm == "before" and not meta.has_final_prenorm:
            raise LayoutCannotHoldError(
                f"{self.trainer} trains on the final state BEFORE the target's final norm, and this store keeps it after "
                "(a norm cannot be undone): capture with `curator hidden-states --final-prenorm`")
        self.trainer_layer_ids(meta.aux_layer_ids)

    @abstractmethod
    def writer(self, stage: Path, source: HandoffSource, sink: FileSink) -> LayoutWriter:
        """Return the writer of this layout's files in `stage`."""

    @abstractmethod
    def launch(self, out: Path, target: str, layer_ids: list[int] | None) -> str:
        """Return the trainer's launch line on this export (`layer_ids` in the trainer's numbering)."""

    def traps(self) -> list[Trap]:
        """Return the traps of a run of this trainer on this layout."""
        return []

