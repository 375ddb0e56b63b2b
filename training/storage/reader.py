"""Reading a store: ids in capture order, samples by id, dequantised to bf16 or handed over as stored.

Opening checks the index against the shards first (training.storage.index).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from training.errors import StoreError, StoreIntegrityError
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.fp8 import dequantize_fp8
from training.storage.index import check_shards, read_index, read_json
from training.storage.shard_file import ShardFile
from training.storage.writer import lock_store


class HiddenStateStore:
    """Read access to a store: ids in capture order, samples by id, dequantised to bf16.

    With `dequantize=False`, an fp8 store's samples come as stored (fp8 values with their
    `aux_scale`/`final_scale`), for a reader that dequantises on its GPU (the trainer): a
    quarter of the bytes through the loader, and no float32 pass on the CPU. Reads are safe
    from several threads (the trainer's prefetch thread beside its evaluation).
    """

    def __init__(self, root: Path, meta: StoreMeta, entries: dict[str, dict[str, Any]], skipped: dict[str, str],
                 dequantize: bool = True, prenorm: bool = False, pread: bool = False, final: bool = True):
        self.root = root
        self.meta = meta
        self._entries = entries
        self._ids = list(entries)
        self.skipped = skipped
        self.dequantize = dequantize
        self.prenorm = prenorm and meta.has_final_prenorm  # read `final_prenorm` too (the trainer never needs it)
        self.pread = pread  # rows read with pread, not through a memory map (a reader of every row once)
        self.final = final and meta.has_final  # read `final` (a reader wanting only the pre-norm state skips it)
        self._handles: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | Path, *, dequantize: bool = True, prenorm: bool = False,
             pread: bool = False, final: bool = True) -> HiddenStateStore:
        """Return the store at `path` (index.json merged with any unmerged parts); StoreError while a
        capture is writing it (a moving store), or when it has no meta.json. `prenorm`: samples carry
        `final_prenorm` too, where the store keeps it; `pread`: rows are read with pread into tensors of
        their own (training.storage.shard_file.ShardFile) instead of through a memory map; `final`
        False: samples leave the final state out (None), read by no one who asks for this."""
        root = Path(path)
        writer = lock_store(root).holder()
        if writer is not None:
            raise StoreError(f"{root} is being written by `curator hidden-states` ({writer}); "
                             "wait for the capture to finish before reading the store")
        meta_path = root / "meta.json"
        if not meta_path.exists():
            raise StoreError(f"{root} is not a hidden-state store (no meta.json); run `curator hidden-states` first")
        meta = StoreMeta.from_json(read_json(meta_path))
        entries, skipped = read_index(root)
        check_shards(root, meta, entries)
        return cls(root, meta, entries, skipped, dequantize=dequantize, prenorm=prenorm, pread=pread, final=final)

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
                h = ShardFile(path) if self.pread else safe_open(str(path), framework="pt")
            except (SafetensorError, ValueError) as exc:  # changed on disk since the store was opened
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
        names = ["input_ids", "loss_mask", "aux"] + (["final"] if self.final else [])
        if self.meta.dtype == "fp8":
            names += ["aux_scale"] + (["final_scale"] if self.final else [])
        if self.prenorm:
            names.append("final_prenorm")
        with self._lock:
            h = self._handle(entry["shard"])
            t = {name: h.get_slice(name)[lo:hi] for name in names}
        sample = HiddenStateSample(
            id=sid,
            input_ids=t["input_ids"].to(torch.long),
            loss_mask=t["loss_mask"].to(torch.bool),
            aux=t["aux"],
            final=t.get("final"),
            final_prenorm=t.get("final_prenorm"),
            category=str(entry.get("category", "")),
        )
        if self.meta.dtype == "fp8":
            if self.dequantize:
                sample.aux = dequantize_fp8(t["aux"], t["aux_scale"])
                sample.final = dequantize_fp8(t["final"], t["final_scale"]) if self.final else None
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

