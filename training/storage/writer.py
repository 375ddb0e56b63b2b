"""Writing a store: one run at a time (a lock file naming the PID), one index part per writer session.

A shard is written under a temporary name and renamed, then the writer's index part is rewritten
the same way; a run starting on a store removes what its index names nowhere (layout and crash
safety: training.storage.format).
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from training.errors import StoreError
from training.io.atomic import TMP_MARK, output_folder
from training.io.diskspace import named_disk_full
from training.io.outlock import OutputLock
from training.io.tempfiles import remove_matching
from training.storage.format import COMPATIBLE_FIELDS, FORMAT, LOCK_FILE, HiddenStateSample, StoreMeta
from training.storage.fp8 import fp8_rows
from training.storage.index import atomic_write_json, read_index, read_json
from training.storage.shard_file import write_parts


def lock_store(out_dir: str | Path) -> OutputLock:
    """Return the (unacquired) lock that makes one run at a time the writer of a store."""
    return OutputLock(out_dir, LOCK_FILE, "`curator hidden-states`")


def store_folders(out_dir: str | Path) -> None:
    """Create the store's `shards/` and `index-parts/`, refusing (OutputPathError) a link planted at
    either: shards would be written, and a killed run's leftovers removed, wherever it points."""
    for name in ("shards", "index-parts"):
        output_folder(out_dir, name)


def claim_store(out_dir: str | Path) -> OutputLock:
    """Return the store's lock, held, after removing what a killed run left (OutputBusyError if another run
    writes it; OutputPathError, nothing removed, if a link is planted at its shards/ or index-parts/)."""
    lock = lock_store(out_dir).acquire()
    try:
        store_folders(out_dir)  # before the sweep below deletes unindexed shards in them
        remove_stale_files(out_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def remove_stale_files(out_dir: str | Path) -> list[Path]:
    """Delete what a killed run left in a store: temporaries, and shards no index names; return them.

    Call it only while holding the store's lock and before any writer starts (a live writer's shard
    is unindexed for a moment between its rename and its index write).
    """
    root = Path(out_dir)
    if not (root / "meta.json").exists():
        return []
    removed = remove_matching(root, [f".*{TMP_MARK}*"])
    removed += remove_matching(root / "index-parts", [f".*{TMP_MARK}*"])
    removed += remove_matching(root / "shards", [".*.tmp", f".*{TMP_MARK}*"])
    stored, _ = read_index(root)
    named = {entry["shard"] for entry in stored.values()}
    shards = root / "shards"
    if shards.is_dir():
        for path in sorted(shards.glob("*.safetensors")):
            if path.name not in named:
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def _check_compatible(existing: StoreMeta, new: StoreMeta, root: Path) -> None:
    diffs = [
        f"{name}: store has {getattr(existing, name)!r}, this run {getattr(new, name)!r}"
        for name in COMPATIBLE_FIELDS
        if getattr(existing, name) != getattr(new, name)
    ]
    if diffs:
        raise StoreError(
            f"{root} already holds hidden states captured differently ({'; '.join(diffs)}); "
            "use another --out directory or the same settings"
        )


class StoreWriter:
    """Appends samples to a store, many per shard; resumable; safe to run one per torchrun rank.

    Each writer session writes its own shards and its own index part, so ranks never touch each
    other's files. `done_ids()` covers everything any earlier session stored or skipped.
    """

    def __init__(
        self,
        out_dir: str | Path,
        meta: StoreMeta,
        shard_max_bytes: int = 512 * 1024**2,
        writer_id: str | None = None,
        flush_workers: int = 0,
    ) -> None:
        self.root = Path(out_dir)
        self.meta = meta
        self.shard_max_bytes = int(shard_max_bytes)
        # Sessions sort by start time (microseconds), which keeps the store's order = capture order.
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1e6) % 1_000_000:06d}"
        self.writer_id = f"{stamp}-{writer_id or 'w'}-{uuid.uuid4().hex[:6]}"
        store_folders(self.root)  # a planted link never receives the shards
        # Held while this session writes: merge_index leaves a live writer's part alone.
        self._part_lock: int | None = os.open(self.root / "index-parts" / f"{self.writer_id}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._part_lock, fcntl.LOCK_EX)
        meta_path = self.root / "meta.json"
        if meta_path.exists():
            _check_compatible(StoreMeta.from_json(read_json(meta_path)), meta, self.root)
        else:
            # Ranks may race here; they all write the same content, and os.replace is atomic.
            atomic_write_json(meta_path, meta.to_json())
        stored, skipped = read_index(self.root)
        self._done: set[str] = set(stored) | set(skipped)
        self._samples: dict[str, dict[str, Any]] = {}
        self._skipped: dict[str, str] = {}
        self._buffer: list[HiddenStateSample] = []
        self._buffer_bytes = 0
        self._shard_no = 0
        self.stored = 0
        self.stored_tokens = 0
        self.skipped_nonfinite = 0
        self.bytes_written = 0
        # With flush_workers > 0, shards are serialised, written and fsynced on a thread pool
        # (torch and file I/O release the GIL), so several shards are in flight at once; the
        # index only ever names shards that are on disk, committed in order.
        self._pool = ThreadPoolExecutor(flush_workers, thread_name_prefix="shard") if flush_workers > 0 else None
        self._pending: list[tuple[str, list[HiddenStateSample], Future[int]]] = []
        self._max_pending = max(1, flush_workers) * 2

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        # Samples in the buffer are complete, so they are kept even when the run is failing.
        self.close()

    def done_ids(self) -> set[str]:
        """Return the ids already stored or skipped (by any session), so a resumed run skips them."""
        return set(self._done)

    def add(self, sample: HiddenStateSample) -> bool:
        """Buffer one sample for the current shard; return False when it was skipped (NaN/inf, duplicate)."""
        if sample.id in self._done:
            return False
        self._validate(sample)
        self._done.add(sample.id)
        if not sample.is_finite():
            self.skipped_nonfinite += 1
            self._skipped[sample.id] = "non-finite hidden state (NaN or inf)"
            self._write_index()
            return False
        self._buffer.append(sample)
        self._buffer_bytes += len(sample) * self.meta.bytes_per_token()
        if self._buffer_bytes >= self.shard_max_bytes:
            self.flush()
        return True

    def _validate(self, s: HiddenStateSample) -> None:
        t = len(s)
        want_aux = (t, self.meta.aux_width)
        if tuple(s.aux.shape) != want_aux or s.loss_mask.shape[0] != t:
            raise StoreError(
                f"sample {s.id!r}: aux {tuple(s.aux.shape)} / mask {tuple(s.loss_mask.shape)} do not fit "
                f"{t} tokens x {len(self.meta.aux_layer_ids)} layers x hidden {self.meta.hidden_size}"
            )
        if self.meta.has_final and (s.final is None or tuple(s.final.shape) != (t, self.meta.hidden_size)):
            raise StoreError(f"sample {s.id!r}: the store keeps the final hidden state [T, H] but the sample has none")
        if self.meta.has_final_prenorm and (s.final_prenorm is None
                                            or tuple(s.final_prenorm.shape) != (t, self.meta.hidden_size)):
            raise StoreError(f"sample {s.id!r}: the store keeps the pre-norm final state [T, H] but the sample has none")
        quantized = s.aux_scale is not None or s.final_scale is not None
        if quantized and self.meta.dtype != "fp8":
            # a bf16 store would keep the fp8 values and drop their scales: wrong numbers, silently
            raise StoreError(f"sample {s.id!r} holds fp8 values with scales; this store keeps {self.meta.dtype}")
        if s.aux_scale is not None and tuple(s.aux_scale.shape) != (t, len(self.meta.aux_layer_ids)):
            raise StoreError(f"sample {s.id!r}: aux_scale {tuple(s.aux_scale.shape)} should be "
                             f"[{t}, {len(self.meta.aux_layer_ids)}] (a scale per token per layer)")
        if s.final_scale is not None and tuple(s.final_scale.shape) != (t, 1):
            raise StoreError(f"sample {s.id!r}: final_scale {tuple(s.final_scale.shape)} should be [{t}, 1]")

    def flush(self) -> None:
        """Write the buffered samples as one shard, then the index part; both atomically."""
        if not self._buffer:
            return
        buffer, self._buffer, self._buffer_bytes = self._buffer, [], 0
        name = f"{self.writer_id}-{self._shard_no:05d}.safetensors"
        self._shard_no += 1
        if self._pool is None:
            self._commit(name, buffer, self._write_shard(name, buffer))
            return
        self._pending.append((name, buffer, self._pool.submit(self._write_shard, name, buffer)))
        while self._pending and (len(self._pending) > self._max_pending or self._pending[0][2].done()):
            done_name, done_buffer, future = self._pending.pop(0)
            self._commit(done_name, done_buffer, future.result())

    def _write_shard(self, name: str, buffer: list[HiddenStateSample]) -> int:
        """Serialise `buffer` into shard `name` (temp file, fsync, rename); return its size.

        Each sample's rows are streamed from its own memory (`write_parts`): no shard-sized
        concatenation is ever built, which at 512 MB shards is what bounded the writer threads.
        """
        meta = self.meta
        parts: dict[str, list[torch.Tensor]] = {
            "input_ids": [s.input_ids.reshape(-1).to(torch.int32) for s in buffer],
            "loss_mask": [s.loss_mask.reshape(-1).to(torch.bool) for s in buffer],
        }
        if meta.dtype == "fp8":
            # Scales are per token, so quantising sample by sample gives the same bytes as
            # quantising the shard at once; samples quantised upstream pass through.
            n_aux = len(meta.aux_layer_ids)
            aux_parts = [fp8_rows(s.aux, s.aux_scale, n_aux) for s in buffer]
            parts["aux"] = [q for q, _ in aux_parts]
            parts["aux_scale"] = [sc for _, sc in aux_parts]
            if meta.has_final:
                final_parts = [fp8_rows(s.final, s.final_scale, 1) for s in buffer]  # type: ignore[arg-type]
                parts["final"] = [q for q, _ in final_parts]
                parts["final_scale"] = [sc for _, sc in final_parts]
        else:
            parts["aux"] = [s.aux.detach().cpu().to(torch.bfloat16) for s in buffer]
            if meta.has_final:
                parts["final"] = [s.final.detach().cpu().to(torch.bfloat16) for s in buffer]  # type: ignore[union-attr]
            if meta.has_final_prenorm:
                parts["final_prenorm"] = [s.final_prenorm.detach().cpu().to(torch.bfloat16)  # type: ignore[union-attr]
                                          for s in buffer]
        path = self.root / "shards" / name
        tmp = path.with_name(f".{name}.tmp")
        try:
            with named_disk_full(path.parent):
                size = write_parts(tmp, parts, {"format": FORMAT})
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a shard cut short by a full disk must not keep the disk full
            raise
        return size

    def _commit(self, name: str, buffer: list[HiddenStateSample], nbytes: int) -> None:
        """Record a shard that is on disk in the index."""
        self.bytes_written += nbytes
        offset = 0
        for s in buffer:
            self._samples[s.id] = {"shard": name, "offset": offset, "length": len(s), "category": s.category,
                                **({"mode": s.mode} if s.mode else {})}
            offset += len(s)
            self.stored += 1
            self.stored_tokens += len(s)
        self._write_index()

    def _write_index(self) -> None:
        atomic_write_json(
            self.root / "index-parts" / f"{self.writer_id}.json",
            {"samples": self._samples, "skipped": self._skipped},
        )

    def close(self) -> None:
        """Flush what is buffered and wait for every shard in flight."""
        self.flush()
        try:
            while self._pending:
                name, buffer, future = self._pending.pop(0)
                self._commit(name, buffer, future.result())
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._part_lock is not None:
                os.close(self._part_lock)
                self._part_lock = None


