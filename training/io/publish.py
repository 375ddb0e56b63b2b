"""Publishing a folder whole: written complete in a hidden sibling, then put in place by one rename.

Readers that glob a folder trust what they find (DuckDB's `'MIX/*.parquet'`, an engine loading an
exported draft), so a published folder must never hold parts of two writes. Its writer builds the
new content in `.NAME.TAG.tmp-PID` beside NAME and exchanges the two folders in one
`renameat2(RENAME_EXCHANGE)` (Linux): a reader sees the old folder or the new one. Where the kernel
or file system cannot exchange, the old folder is renamed aside (`.NAME.old.tmp-PID`) and the new
one into place: a reader in between finds no folder, never a mixture, and a writer killed there has
the old folder renamed back by the next one (`Publisher.remove_stale`).

Used by `build-mix` (curator.mix.publish) and `curator export` (training.export.export). Each holds
its own lock beside the folder while it publishes (one writer at a time; the folder itself is
swapped, so the lock cannot live in it) and says what a leftover of its own may hold (`owns`): only
folders by these names whose content is the writer's are removed or restored; anything else is kept.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from training.io.atomic import TMP_MARK, fsync_path

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
ASIDE_TAG = "old"


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2); False when the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _anything(path: Path) -> bool:
    return True


@dataclass(frozen=True)
class Publisher:
    """How one writer publishes the folder `out`: its staging tag and what its leftovers may hold."""

    out: Path  # absolute; the folder a link points to when --out is a link (the link is kept)
    tag: str  # names this writer's staging folders: `.NAME.TAG.tmp-PID`
    owns: Callable[[Path], bool] = _anything  # whether a leftover folder by this writer's names holds only its files

    @classmethod
    def of(cls, out: str | Path, tag: str, owns: Callable[[Path], bool] = _anything) -> Publisher:
        return cls(Path(out).absolute(), tag, owns)

    def _named(self, tag: str, pid: int | str) -> Path:
        return self.out.parent / f".{self.out.name}.{tag}{TMP_MARK}{pid}"

    @property
    def stage(self) -> Path:
        """Return the sibling folder this process writes the new content in."""
        return self._named(self.tag, os.getpid())

    @property
    def aside(self) -> Path:
        return self._named(ASIDE_TAG, os.getpid())

    def leftovers(self, tag: str) -> list[Path]:
        """Return the folders of killed writers by `tag`'s names that this writer owns, oldest first."""
        parent = self.out.parent
        if not parent.is_dir():
            return []
        found = (p for p in parent.glob(f".{glob.escape(self.out.name)}.{tag}{TMP_MARK}*")
                 if p.name[len(f".{self.out.name}.{tag}{TMP_MARK}"):].isdigit()
                 and p.is_dir() and not p.is_symlink() and self.owns(p))
        return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))

    def remove_stale(self) -> list[Path]:
        """Clean up after killed writers (hold the lock): restore a folder left renamed aside, remove
        staging folders and other aside copies; return what was removed."""
        asides = self.leftovers(ASIDE_TAG)
        if asides and not self.out.exists() and not self.out.is_symlink():
            os.rename(asides.pop(), self.out)  # killed between the two renames of a fallback swap: the old folder is back
        removed = []
        for path in [*asides, *self.leftovers(self.tag)]:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        return removed

    def swap_in(self, stage: Path) -> None:
        """Make the finished folder `stage` the folder `out`, and remove the folder it replaces.

        An OSError leaves the earlier folder in place (or aside, for the next writer's remove_stale).
        """
        out = self.out
        if not out.exists():
            os.rename(stage, out)
            old = None
        elif exchange(stage, out):
            old = stage
        else:
            old = self.aside
            os.rename(out, old)
            try:
                os.rename(stage, out)
            except OSError:
                os.rename(old, out)
                raise
        fsync_path(out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    @contextmanager
    def staged(self) -> Iterator[Path]:
        """Yield the staging folder (created); when the block ends it is swapped in, and an exception
        removes it instead. Hold the writer's lock and call remove_stale first."""
        stage = self.stage
        stage.mkdir(parents=True)  # a leftover by this name was the writer's own and went with remove_stale
        try:
            yield stage
            self.swap_in(stage)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
