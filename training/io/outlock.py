"""One writer per output folder: an exclusive lock file that holds the writer's PID.

The lock is an flock on `<folder>/<name>`, so the kernel drops it when the holder dies (SIGKILL
included) and the next run takes it over at once; the file's content (PID and host) is only there
to name the holder in the refusal. A run that finishes removes the file while still holding it,
and a run that got the lock checks that the path still names the file it locked, so a waiter that
opened the old file just before it was removed cannot end up writing beside a newer holder.
Nothing is ever written through a link planted at the lock path: a symlink or a second hard link
there is removed (the file it names keeps its content) and the lock file made anew.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

from training.errors import TrainingError
from training.io.diskspace import named_disk_full


class OutputBusyError(TrainingError):
    """Another live process is writing to the same output folder."""


class OutputLock:
    """Exclusive lock on an output folder for one stage (`with OutputLock(folder, ".x.lock", "curator x"):`)."""

    def __init__(self, folder: str | Path, name: str, stage: str, guards: str | Path | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / name
        self.stage = stage
        # the output the lock stands for, named in the refusal: `folder` itself, or (for a lock kept
        # beside an output that is replaced whole, as export's) that output
        self.guards = Path(guards) if guards is not None else self.folder
        self._fd: int | None = None
        self._made: list[Path] = []  # the folders the lock made, deepest first: left empty, they go

    def acquire(self) -> OutputLock:
        """Take the lock or raise OutputBusyError naming the live holder's PID; return self."""
        while True:
            made = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                # never through a link: a symlink planted at the lock path would have the record
                # (and the truncation before it) written into whatever file it points to
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except FileNotFoundError:  # a holder that failed removed its empty folder as we made it
                continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # a symlink: removed (its target untouched), our own file made
                    self._remove_planted()
                    continue
                raise TrainingError(f"cannot open the lock file {self.path} ({exc.strerror}); "
                                    "remove it or use another output folder") from None
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise TrainingError(f"{self.path} is in the way of the lock file (not a regular file); "
                                    "remove it or use another output folder")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
                os.close(fd)
                who = f"PID {holder[0]}" + (f" on {holder[1]}" if len(holder) > 1 else "") if holder else "another process"
                raise OutputBusyError(
                    f"{self.guards} is being written by another {self.stage} ({who}); "
                    "wait for it to finish or use another output folder"
                ) from None
            try:
                same = info.st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same and info.st_nlink > 1:
                # a hard link planted at the lock path: the record would overwrite the other name's
                # file; drop our name for it (that file keeps its content) and make our own
                os.close(fd)
                self.path.unlink(missing_ok=True)
                continue
            if same:
                break
            os.close(fd)  # the previous holder removed the file as we opened it: lock the new one
        self._fd = fd
        self._made = made
        try:
            # the record is a write like any other: a full disk is named as the other writers name it
            with named_disk_full(self.folder):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except BaseException:
            self.release()  # still held, so removing it is safe: no 0-byte lock (and no folder we made) is left
            raise
        return self

    def _remove_planted(self) -> None:
        """Remove a symlink at the lock path (only a symlink: the file it points to is never touched)."""
        try:
            if stat.S_ISLNK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise TrainingError(f"{self.path} is a link where the lock file belongs and cannot be removed "
                                f"({exc.strerror}); remove it or use another output folder") from None

    def holder(self) -> str | None:
        """Return who holds the lock ("PID n on host") while a live process does, else None (takes nothing)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # absent, or a link or something else no holder made: nobody holds it
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            return f"PID {held[0]}" + (f" on {held[1]}" if len(held) > 1 else "") if held else "another process"
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        """Remove the lock file and let go of the lock (nothing when not held); remove the folder too
        when this lock made it and the run left nothing in it (a run refused at its inputs)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        for folder in self._made:
            try:
                folder.rmdir()  # only ever an empty folder: anything written in it stays
            except OSError:
                break
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
