"""A store's index: reading and merging its parts, and checking every entry against its shards.

A store may come from elsewhere (copied, downloaded), so the index is checked before anything is
read: every shard named is a plain file of `shards/`, every entry's rows lie inside its shard, and
every tensor has the rows, widths and dtype the meta promises (layout: training.storage.format).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any, TypeGuard

from safetensors import SafetensorError, safe_open

from training.errors import StoreError, StoreIntegrityError
from training.io.atomic import write_json
from training.storage.format import StoreMeta, shard_tensors
from training.io.jsonfile import parse_json


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` as compact JSON to `path` atomically."""
    write_json(path, data, separators=(",", ":"))


def read_json(path: Path) -> Any:
    try:
        return parse_json(path.read_bytes())  # a 5,000-digit number or 100K-deep nesting is a named error too
    except ValueError as exc:
        raise StoreError(f"{path} is not valid JSON ({exc}); restore it or delete the store and capture again") from None


def _bad_entry(sid: str, where: Path, field: str, why: str) -> StoreIntegrityError:
    return StoreIntegrityError(f"{where}: sample {sid!r}: {field} {why}; the index is damaged or "
                               "was not written by this toolkit: capture the store again")


def _plain_shard_name(shard: Any) -> TypeGuard[str]:
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
        data = read_json(path)
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


class PartLock:
    """Non-blocking try of a writer's part lock: `with PartLock(path) as free:` (free: no live writer holds it)."""

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
            with PartLock(p.with_suffix(".lock")) as free:
                if free:
                    p.unlink(missing_ok=True)
                    p.with_suffix(".lock").unlink(missing_ok=True)
        for lock in parts.glob("*.lock"):  # sessions that stored nothing leave only their lock
            if not lock.with_suffix(".json").exists():
                with PartLock(lock) as free:
                    if free:
                        lock.unlink(missing_ok=True)
    return len(samples)


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


