"""Which scout runs are still alive: each run holds an exclusive flock on its own lease file
(`<catalog>.scouts/<run_id>.lock`) for as long as its process lives.

The kernel drops a flock when its process ends, however it ends (SIGKILL, OOM, a power cut on
a local disk), so a `running` row whose lease can be taken belongs to a run that is gone: the
next scout marks it `aborted` instead of leaving it `running` forever.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def lease_path(catalog: Path, run_id: str) -> Path:
    """Return the lease file of one run of the scouts writing to `catalog`."""
    return catalog.with_name(catalog.name + ".scouts") / f"{run_id}.lock"


class RunLease:
    """The lease of one live run: `hold()` at its start, `release()` at its end."""

    def __init__(self, catalog: Path, run_id: str) -> None:
        self.path = lease_path(catalog, run_id)
        self._fd: int | None = None

    def hold(self) -> None:
        """Take the run's lease (before its row says `running`, so no other scout sees it stale)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        """Give the lease up and remove its file."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def is_alive(catalog: Path, run_id: str) -> bool:
    """Return whether the process of run `run_id` still holds its lease."""
    path = lease_path(catalog, run_id)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False  # never leased (a curator from before leases) or released at its end
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    path.unlink(missing_ok=True)  # a dead run's lease: nothing else will remove it
    return False
