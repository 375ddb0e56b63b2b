"""Disk-full, said as such: every stage names the folder and the bytes left instead of a bare OSError.

A full disk shows up as ENOSPC (or EDQUOT, over a quota) from any write, inside torch's zip
writer as a RuntimeError ("unexpected pos ..."), and inside safetensors' writer as a
SafetensorError ("... No space left on device (os error 28)"); all become one DiskFullError whose
message is "disk full at PATH: N bytes free", which the CLI prints as one line.
"""

from __future__ import annotations

import errno
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training.errors import TrainingError

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# torch.save reports a short write of its zip container this way (it drops the errno).
_TORCH_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed writing")
# safetensors (Rust) keeps the errno only in its message: "I/O error: ... (os error 28)".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class DiskFullError(TrainingError):
    """A write failed because the disk (or the user's quota) is full."""


def free_bytes(path: str | Path) -> int:
    """Return the free bytes of the filesystem holding `path` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return 0


def is_disk_full(exc: BaseException) -> bool:
    """Return whether `exc` is a write that failed for want of space."""
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    if isinstance(exc, RuntimeError) and any(mark in str(exc) for mark in _TORCH_SHORT_WRITE):
        return True
    if type(exc).__name__ == "SafetensorError":  # matched by name: this module stays standard library only
        return any(int(code) in _FULL_ERRNOS for code in _RUST_OS_ERROR.findall(str(exc)))
    return False


def disk_full_error(path: str | Path) -> DiskFullError:
    """Return the error that names a full disk at `path` and what is left on it."""
    return DiskFullError(f"disk full at {path}: {free_bytes(path)} bytes free; free some space or write elsewhere")


@contextmanager
def named_disk_full(path: str | Path) -> Iterator[None]:
    """Turn a disk-full failure inside the block into a DiskFullError naming `path`; other errors pass."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only a disk-full is turned; everything else passes as it was
        if isinstance(exc, DiskFullError) or not is_disk_full(exc):
            raise
        raise disk_full_error(path) from exc
