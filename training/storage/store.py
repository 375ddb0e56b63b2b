"""The hidden-state store: many samples per safetensors shard, a JSON index, and meta.json.

Layout of a store directory:

    meta.json                    StoreMeta (target, widths, layer ids and their convention, dtype, hashes)
    index.json                   merged index: {"samples": {id: entry}, "skipped": {id: reason}}
    index-parts/<writer>.json    one per writer session (a torchrun rank, a resumed run), same shape;
                                 readers merge index.json with every part, so an unmerged store is readable
    shards/<writer>-00000.safetensors

A shard holds its samples concatenated along the token axis, so its header stays small whatever
the sample count:

    input_ids  int32 [N]          loss_mask bool [N]
    aux        bf16|fp8 [N, 3H]   aux_scale  float32 [N, 3]   (fp8 only)
    final      bf16|fp8 [N, H]    final_scale float32 [N, 1]  (fp8 only; final only when has_final)

An index entry is {"shard", "offset", "length", "category", "mode"?}: the sample's rows are
[offset, offset + length) of every tensor in that shard.

fp8 is float8_e4m3fn with one float32 scale per token and captured layer (each H-wide row is scaled
by its own absmax / 448; layers differ in magnitude by orders, so one scale across the three would
waste the low layer's precision). Samples are dequantised to bf16 on read, or handed over as stored
(`HiddenStateStore.open(..., dequantize=False)`) for the trainer to dequantise on its GPU.

Writes are crash-safe: a shard is written under a temporary name and renamed, then the writer's
index part is rewritten the same way. A crash between the two leaves an unindexed shard, whose
samples are simply captured again on resume; nothing half-written is ever read. The index is the
store's manifest: readers see only the shards it names, and a run starting on a store removes
what is named nowhere (temporaries and unindexed shards of a killed run, `remove_stale_files`).

A store may come from elsewhere (copied, downloaded), so opening one checks its index against its
shards before anything is read (`check_entry`, `check_shards`): every shard named is a plain file
of `shards/`, every entry's rows lie inside its shard, and every tensor has the rows, widths and
dtype the meta promises. What does not fit is a StoreIntegrityError naming the file, the sample
and the field.

One run writes a store at a time (`lock_store`, a lock file naming the PID); within a run each
writer session (a torchrun rank) holds a lock on its own index part, so `merge_index` never
removes the part of a writer that is still running.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from training.io.atomic import TMP_MARK, write_json
from training.io.diskspace import named_disk_full
from training.target.layers import CONVENTION, normalise
from training.errors import StoreError, StoreIntegrityError
from training.io.outlock import OutputLock
from training.storage.shard_file import write_parts
from training.io.tempfiles import remove_matching

FORMAT = "curator-hidden-states/1"
LOCK_FILE = ".hidden-states.lock"
FP8_MAX = 448.0  # largest finite float8_e4m3fn
DTYPES = ("bf16", "fp8")
# Fields that must agree when a writer reopens a store: mixing them would make samples incomparable.
COMPATIBLE_FIELDS = (
    "hidden_size",
    "num_layers",
    "aux_layer_ids",
    "layer_convention",
    "dtype",
    "has_final",
    "chat_template_sha256",
    "tokenizer_sha256",
)


@dataclass
class StoreMeta:
    """What a store holds and how it was made (written to meta.json)."""

    target: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    aux_layer_ids: list[int]
    layer_convention: str = CONVENTION  # see training.target.layers; normalised to it when the meta is made
    dtype: str = "bf16"
    has_final: bool = True
    chat_template_sha256: str = ""
    tokenizer_sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise StoreError(f"store dtype must be one of {DTYPES}, not {self.dtype!r}")
        # One numbering everywhere after this point, whatever an older store recorded.
        self.aux_layer_ids = normalise(self.aux_layer_ids, self.layer_convention)
        self.layer_convention = CONVENTION

    @property
    def aux_width(self) -> int:
        """Return the width of the stored aux row (n_aux_layers * hidden_size)."""
        return len(self.aux_layer_ids) * self.hidden_size

    def bytes_per_token(self) -> int:
        """Return the bytes one stored token costs (hidden rows + scales + ids + mask)."""
        return bytes_per_token(self.hidden_size, len(self.aux_layer_ids), self.dtype, self.has_final)

    def to_json(self) -> dict[str, Any]:
        """Return meta.json's content."""
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoreMeta:
        """Return the meta read from meta.json's content (unknown keys go to `extra`)."""
        data = dict(data)
        fmt = data.pop("format", None)
        if fmt != FORMAT:
            raise StoreError(f"meta.json has format {fmt!r}, expected {FORMAT!r}: not a store written by this toolkit")
        known = set(cls.__dataclass_fields__)
        extra = dict(data.pop("extra", {}) or {})
        extra.update({k: v for k, v in data.items() if k not in known})
        required = [n for n, f in cls.__dataclass_fields__.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise StoreError(f"meta.json lacks {', '.join(missing)}: the store is damaged or was written by another tool")
        return cls(**{k: v for k, v in data.items() if k in known}, extra=extra)


def bytes_per_token(hidden_size: int, n_aux: int, dtype: str, has_final: bool) -> int:
    """Return the stored bytes per token: hidden rows, fp8 scales, int32 id and bool mask."""
    rows = n_aux + (1 if has_final else 0)
    per_row = hidden_size * (1 if dtype == "fp8" else 2) + (4 if dtype == "fp8" else 0)
    return rows * per_row + 4 + 1


@dataclass
class HiddenStateSample:
    """One captured sample: token ids, loss mask, aux states [T, n_aux*H] and the final state [T, H]."""

    id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor | None = None
    category: str = ""
    mode: str = ""  # which generation mode made the sample's ids: "token" (stored ids) or "text" (re-tokenised)
    # Checked where the states were made (one reduction on the GPU) instead of by a pass over
    # the host copy in the writer thread; None: check here.
    finite: bool | None = None
    # Set when aux/final arrive already quantised to fp8 (on the GPU, before the copy to the
    # host: half the bytes to move): float32 scales [T, n_rows], as quantize_fp8 returns them.
    aux_scale: torch.Tensor | None = None
    final_scale: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def is_finite(self) -> bool:
        """Return False when any captured state holds NaN or inf."""
        if self.finite is not None:
            return self.finite
        # fp8 values read as stored come with their scales: a NaN/inf scale poisons the row too
        parts = (self.aux, self.final, self.aux_scale, self.final_scale)
        return all(bool(torch.isfinite(t.float()).all()) for t in parts if t is not None)


def quantize_fp8(x: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (fp8 values [T, n_rows*H], float32 scales [T, n_rows]) for x [T, n_rows*H]."""
    t = x.shape[0]
    rows = x.float().reshape(t, n_rows, x.shape[-1] // n_rows)
    amax = rows.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (rows / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(t, x.shape[-1]), scale


def _fp8(x: torch.Tensor, scale: torch.Tensor | None, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (fp8 values, scales) on the host: as given when already quantised, else quantised here."""
    if scale is not None:
        if x.dtype != torch.float8_e4m3fn:
            raise StoreError(f"a sample with fp8 scales must hold float8_e4m3fn values, not {x.dtype}")
        return x.detach().cpu(), scale.detach().cpu().float()
    if x.dtype == torch.float8_e4m3fn:
        raise StoreError("a sample holds fp8 values without their scales")
    return quantize_fp8(x.detach().cpu(), n_rows)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Return values [..., n_rows*H] from fp8 values and their per-row float32 scales [..., n_rows]."""
    rows = q.float().reshape(*scale.shape, q.shape[-1] // scale.shape[-1]) * scale.float().unsqueeze(-1)
    return rows.reshape(q.shape).to(dtype)


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` as compact JSON to `path` atomically."""
    write_json(path, data, separators=(",", ":"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path} is not valid JSON ({exc}); restore it or delete the store and capture again") from exc


def _bad_entry(sid: str, where: Path, field: str, why: str) -> StoreIntegrityError:
    return StoreIntegrityError(f"{where}: sample {sid!r}: {field} {why}; the index is damaged or "
                               "was not written by this toolkit: capture the store again")


def _plain_shard_name(shard: Any) -> bool:
    return (isinstance(shard, str) and not shard.startswith(".") and shard.endswith(".safetensors")
            and not any(c in shard for c in ("/", "\\", "\0")))


def check_entry(sid: str, entry: Any, where: Path, shards_ok: set[str] | None = None) -> None:
    """Refuse an index entry whose fields could read outside the store or outside its rows.

    The shard must be a plain `.safetensors` file name of `shards/` (no folder, no `..`, not a
    temporary), the offset an int >= 0 and the length an int >= 1. `shards_ok` holds the shard names
    already found plain (each is checked once over an index of many entries); new ones are added.
    """
    if not isinstance(entry, dict):
        raise _bad_entry(sid, where, "entry", f"is {type(entry).__name__}, not an object")
    shard = entry.get("shard")
    if shards_ok is None or not isinstance(shard, str) or shard not in shards_ok:
        if not _plain_shard_name(shard):
            raise _bad_entry(sid, where, "shard",
                             f"{shard!r} is not a file name in the store's shards/ folder (a plain *.safetensors name)")
        if shards_ok is not None:
            shards_ok.add(shard)
    for name, least in (("offset", 0), ("length", 1)):
        value = entry.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise _bad_entry(sid, where, name, f"is {value!r}, not an integer >= {least}")
    if not isinstance(entry.get("category", ""), str) or not isinstance(entry.get("mode", ""), str):
        raise _bad_entry(sid, where, "category/mode", "is not a string")


def read_index(root: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Return (samples: id -> entry, skipped: id -> reason) merged over index.json and every part.

    Parts are read in name order (writer names start with a timestamp), and the first entry for
    an id wins, so the order of samples is the order they were captured in. Every entry is
    checked (`check_entry`); a malformed file or entry is a StoreIntegrityError naming it.
    """
    samples: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    files = []
    if (root / "index.json").exists():
        files.append(root / "index.json")
    parts = root / "index-parts"
    if parts.is_dir():
        files.extend(sorted(p for p in parts.glob("*.json") if not p.name.startswith(".")))
    shards_ok: set[str] = set()  # shard names found plain: each checked once
    for path in files:
        data = _read_json(path)
        if not isinstance(data, dict) or not all(isinstance(data.get(k, {}), dict) for k in ("samples", "skipped")):
            raise StoreIntegrityError(f"{path} is not a store index (an object with \"samples\" and \"skipped\" "
                                      "objects); the store is damaged: capture it again")
        for sid, entry in data.get("samples", {}).items():
            check_entry(sid, entry, path, shards_ok)
            samples.setdefault(sid, entry)
        for sid, reason in data.get("skipped", {}).items():
            skipped.setdefault(sid, str(reason))
    for sid in samples:
        skipped.pop(sid, None)
    return samples, skipped


def merge_index(path: str | Path) -> int:
    """Fold every index part into index.json (atomically) and remove the parts; return the sample count.

    The part of a writer that is still running (its part lock held) is folded in but kept: it will
    be rewritten with more samples, and removing it would lose those from the index.
    """
    root = Path(path)
    samples, skipped = read_index(root)
    atomic_write_json(root / "index.json", {"samples": samples, "skipped": skipped})
    parts = root / "index-parts"
    if parts.is_dir():
        for p in parts.glob("*.json"):
            if p.name.startswith("."):
                continue
            with _PartLock(p.with_suffix(".lock")) as free:
                if free:
                    p.unlink(missing_ok=True)
                    p.with_suffix(".lock").unlink(missing_ok=True)
        for lock in parts.glob("*.lock"):  # sessions that stored nothing leave only their lock
            if not lock.with_suffix(".json").exists():
                with _PartLock(lock) as free:
                    if free:
                        lock.unlink(missing_ok=True)
    return len(samples)


class _PartLock:
    """Non-blocking try of a writer's part lock: `with _PartLock(path) as free:` (free: no live writer holds it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> bool:
        if not self.path.exists():
            return True
        try:
            self._fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def lock_store(out_dir: str | Path) -> OutputLock:
    """Return the (unacquired) lock that makes one run at a time the writer of a store."""
    return OutputLock(out_dir, LOCK_FILE, "`curator hidden-states`")


def claim_store(out_dir: str | Path) -> OutputLock:
    """Return the store's lock, held, after removing what a killed run left (OutputBusyError if another run writes it)."""
    lock = lock_store(out_dir).acquire()
    try:
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
        (self.root / "shards").mkdir(parents=True, exist_ok=True)
        (self.root / "index-parts").mkdir(parents=True, exist_ok=True)
        # Held while this session writes: merge_index leaves a live writer's part alone.
        self._part_lock: int | None = os.open(self.root / "index-parts" / f"{self.writer_id}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._part_lock, fcntl.LOCK_EX)
        meta_path = self.root / "meta.json"
        if meta_path.exists():
            _check_compatible(StoreMeta.from_json(_read_json(meta_path)), meta, self.root)
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
            aux_parts = [_fp8(s.aux, s.aux_scale, n_aux) for s in buffer]
            parts["aux"] = [q for q, _ in aux_parts]
            parts["aux_scale"] = [sc for _, sc in aux_parts]
            if meta.has_final:
                final_parts = [_fp8(s.final, s.final_scale, 1) for s in buffer]  # type: ignore[arg-type]
                parts["final"] = [q for q, _ in final_parts]
                parts["final_scale"] = [sc for _, sc in final_parts]
        else:
            parts["aux"] = [s.aux.detach().cpu().to(torch.bfloat16) for s in buffer]
            if meta.has_final:
                parts["final"] = [s.final.detach().cpu().to(torch.bfloat16) for s in buffer]  # type: ignore[union-attr]
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


def shard_tensors(meta: StoreMeta) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Return what every shard of a store holds: tensor name -> (allowed safetensors dtypes, shape after the rows)."""
    states = ("F8_E4M3",) if meta.dtype == "fp8" else ("BF16",)
    want: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
        "input_ids": (("I32", "I64"), ()),
        "loss_mask": (("BOOL",), ()),
        "aux": (states, (meta.aux_width,)),
    }
    if meta.has_final:
        want["final"] = (states, (meta.hidden_size,))
    if meta.dtype == "fp8":
        want["aux_scale"] = (("F32",), (len(meta.aux_layer_ids),))
        if meta.has_final:
            want["final_scale"] = (("F32",), (1,))
    return want


def _shard_rows(path: Path, meta: StoreMeta) -> int:
    """Return the row count of shard `path` after checking that it is whole and holds what `meta` says."""
    try:
        with safe_open(str(path), framework="pt") as h:
            present = set(h.keys())
            slices = {name: h.get_slice(name) for name in shard_tensors(meta) if name in present}
            shapes = {name: (sl.get_dtype(), list(sl.get_shape())) for name, sl in slices.items()}
    except (OSError, SafetensorError) as exc:
        raise StoreIntegrityError(f"shard {path} is damaged ({exc}); was it copied completely? "
                                  "Copy it again or capture the store again") from exc
    rows: int | None = None
    for name, (dtypes, tail) in shard_tensors(meta).items():
        if name not in shapes:
            raise StoreIntegrityError(f"shard {path} has no tensor {name!r}; the store's meta.json promises it")
        dtype, shape = shapes[name]
        if dtype not in dtypes or len(shape) != 1 + len(tail) or tuple(shape[1:]) != tail:
            raise StoreIntegrityError(f"shard {path}: tensor {name!r} is {dtype} {shape}, expected "
                                      f"{'/'.join(dtypes)} [rows{''.join(f', {d}' for d in tail)}] for this store's meta.json")
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            raise StoreIntegrityError(f"shard {path}: tensor {name!r} has {shape[0]} rows where input_ids has {rows}")
    return int(rows or 0)


def check_shards(root: Path, meta: StoreMeta, entries: dict[str, dict[str, Any]]) -> None:
    """Refuse a store whose index does not fit its shards; StoreIntegrityError names the shard, sample and field.

    Reads only each shard's header, once per shard (a few ms for a thousand shards).
    """
    shards_dir = (root / "shards").resolve()
    by_shard: dict[str, list[str]] = {}
    for sid, entry in entries.items():
        by_shard.setdefault(entry["shard"], []).append(sid)
    for name, sids in by_shard.items():
        path = root / "shards" / name
        if not path.exists():
            raise StoreIntegrityError(f"shard {path} named in the index (sample {sids[0]!r}) is missing; "
                                      "the store was copied incompletely")
        if path.resolve().parent != shards_dir:
            raise StoreIntegrityError(f"shard {path} (sample {sids[0]!r}) is a link to {path.resolve()}, outside "
                                      f"{shards_dir}; refusing to read it")
        rows = _shard_rows(path, meta)
        for sid in sids:
            entry = entries[sid]
            if entry["offset"] + entry["length"] > rows:
                raise StoreIntegrityError(
                    f"{root}: sample {sid!r}: offset {entry['offset']} + length {entry['length']} runs past the end "
                    f"of shard {name} ({rows} rows); the index does not belong to these shards")


class HiddenStateStore:
    """Read access to a store: ids in capture order, samples by id, dequantised to bf16.

    With `dequantize=False`, an fp8 store's samples come as stored (fp8 values with their
    `aux_scale`/`final_scale`), for a reader that dequantises on its GPU (the trainer): a
    quarter of the bytes through the loader, and no float32 pass on the CPU. Reads are safe
    from several threads (the trainer's prefetch thread beside its evaluation).
    """

    def __init__(self, root: Path, meta: StoreMeta, entries: dict[str, dict[str, Any]], skipped: dict[str, str],
                 dequantize: bool = True):
        self.root = root
        self.meta = meta
        self._entries = entries
        self._ids = list(entries)
        self.skipped = skipped
        self.dequantize = dequantize
        self._handles: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | Path, *, dequantize: bool = True) -> HiddenStateStore:
        """Return the store at `path` (index.json merged with any unmerged parts); StoreError while a
        capture is writing it (a moving store), or when it has no meta.json."""
        root = Path(path)
        writer = lock_store(root).holder()
        if writer is not None:
            raise StoreError(f"{root} is being written by `curator hidden-states` ({writer}); "
                             "wait for the capture to finish before reading the store")
        meta_path = root / "meta.json"
        if not meta_path.exists():
            raise StoreError(f"{root} is not a hidden-state store (no meta.json); run `curator hidden-states` first")
        meta = StoreMeta.from_json(_read_json(meta_path))
        entries, skipped = read_index(root)
        check_shards(root, meta, entries)
        return cls(root, meta, entries, skipped, dequantize=dequantize)

    def ids(self) -> list[str]:
        """Return the stored sample ids in index order."""
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, sid: object) -> bool:
        return sid in self._entries

    def length(self, sid: str) -> int:
        """Return the token count of sample `sid` without reading its tensors."""
        return int(self._entries[sid]["length"])

    def category(self, sid: str) -> str:
        """Return the category recorded for sample `sid`."""
        return str(self._entries[sid].get("category", ""))

    def mode(self, sid: str) -> str:
        """Return which generation mode made sample `sid`'s ids: "token", "text", or "" (not recorded)."""
        return str(self._entries[sid].get("mode", ""))

    def total_tokens(self) -> int:
        """Return the number of tokens over all stored samples."""
        return sum(int(e["length"]) for e in self._entries.values())

    def _handle(self, shard: str) -> Any:
        h = self._handles.get(shard)
        if h is None:
            path = self.root / "shards" / shard  # a plain name of shards/, checked when the store was opened
            if not path.exists():
                raise StoreError(f"shard {path} named in the index is missing; the store was copied incompletely")
            try:
                h = safe_open(str(path), framework="pt")
            except SafetensorError as exc:  # changed on disk since the store was opened
                raise StoreIntegrityError(f"shard {path} is damaged ({exc}); copy it again or capture again") from exc
            self._handles[shard] = h
            if len(self._handles) > 16:  # bound open files on stores with thousands of shards
                self._handles.popitem(last=False)
        else:
            self._handles.move_to_end(shard)
        return h

    def __getitem__(self, sid: str) -> HiddenStateSample:
        entry = self._entries.get(sid)
        if entry is None:
            raise KeyError(sid)
        lo, hi = int(entry["offset"]), int(entry["offset"]) + int(entry["length"])
        names = ["input_ids", "loss_mask", "aux"] + (["final"] if self.meta.has_final else [])
        if self.meta.dtype == "fp8":
            names += ["aux_scale"] + (["final_scale"] if self.meta.has_final else [])
        with self._lock:
            h = self._handle(entry["shard"])
            t = {name: h.get_slice(name)[lo:hi] for name in names}
        sample = HiddenStateSample(
            id=sid,
            input_ids=t["input_ids"].to(torch.long),
            loss_mask=t["loss_mask"].to(torch.bool),
            aux=t["aux"],
            final=t.get("final"),
            category=str(entry.get("category", "")),
        )
        if self.meta.dtype == "fp8":
            if self.dequantize:
                sample.aux = dequantize_fp8(t["aux"], t["aux_scale"])
                sample.final = dequantize_fp8(t["final"], t["final_scale"]) if self.meta.has_final else None
            else:
                sample.aux_scale, sample.final_scale = t["aux_scale"], t.get("final_scale")
        return sample

    def __iter__(self) -> Iterator[HiddenStateSample]:
        for sid in self._ids:
            yield self[sid]

    def load_many(self, ids: list[str]) -> list[HiddenStateSample]:
        """Return the samples `ids` (the trainer reads whole batches through this)."""
        return [self[sid] for sid in ids]

    def tokens(self, sid: str) -> HiddenStateSample:
        """Return sample `sid` with its token ids and loss mask only (aux empty): cheap reads for
        counting the draft vocabulary over a store of terabytes."""
        entry = self._entries[sid]
        lo, hi = int(entry["offset"]), int(entry["offset"]) + int(entry["length"])
        with self._lock:
            h = self._handle(entry["shard"])
            input_ids, loss_mask = h.get_slice("input_ids")[lo:hi], h.get_slice("loss_mask")[lo:hi]
        return HiddenStateSample(id=sid, input_ids=input_ids.to(torch.long), loss_mask=loss_mask.to(torch.bool),
                                 aux=torch.empty(0), category=str(entry.get("category", "")))

    def disk_bytes(self) -> int:
        """Return the bytes the store's indexed shards take on disk (leftovers of a crash are not the store)."""
        shards = {entry["shard"] for entry in self._entries.values()}
        return sum(p.stat().st_size for name in shards if (p := self.root / "shards" / name).exists())

