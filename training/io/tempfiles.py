"""Stale temporaries: what a killed or disk-full run left under temporary names, removed on start.

Every stage writes to a temporary name in the destination folder and renames; a crash between
the two leaves the temporary behind (after a disk-full, at the size that filled the disk). Each
stage calls these on start, while it holds its output folder's lock, so nothing live is removed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path


def remove_matching(folder: str | Path, patterns: Iterable[str]) -> list[Path]:
    """Delete the files and folders directly under `folder` that match any glob pattern; return them."""
    root = Path(folder)
    if not root.is_dir():
        return []
    removed: list[Path] = []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def remove_stale_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Delete the `.step-*.tmp` folders an interrupted checkpoint save left in `checkpoints_dir`; return them.

    Call it once at the start of training, on the rank that saves, before the first save.
    """
    return remove_matching(checkpoints_dir, [".step-*.tmp"])
