"""Atomic file writes: readers see the old file or the whole new one, never a part.

The standard library only (no torch), so that the data side imports it without the model side.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from training.io.diskspace import named_disk_full

# Every temporary name holds this mark, so a sweep can tell leftovers of a crash from data.
TMP_MARK = ".tmp-"


def write_bytes(path: str | Path, data: bytes, *, fsync: bool = True) -> Path:
    """Write `data` to `path` (parents created) through a temp file in its folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        with named_disk_full(path.parent), open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str, *, fsync: bool = True) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_json(path: str | Path, obj: Any, *, fsync: bool = True, **dumps: Any) -> Path:
    """Write `obj` as JSON (`json.dumps(obj, **dumps)`) to `path` atomically."""
    return write_text(path, json.dumps(obj, **dumps), fsync=fsync)


def fsync_path(path: str | Path) -> None:
    """Flush a file, or a folder's entries (so that a rename in it survives a power cut), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
