"""The output lock: a full disk while writing its record is named, and leaves no lock file behind."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from training.io import outlock
from training.io.diskspace import DiskFullError
from training.io.outlock import OutputLock


def test_a_full_disk_writing_the_lock_record_is_the_named_error_and_leaves_no_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "new" / "run"

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outlock.os, "pwrite", full)
    with pytest.raises(DiskFullError, match=f"disk full at {out}: .* bytes free"):
        OutputLock(out, ".train.lock", "curator train").acquire()
    # no 0-byte lock, and the folders the lock made for it are gone again
    assert not (out / ".train.lock").exists() and not (tmp_path / "new").exists()
    monkeypatch.undo()
    with OutputLock(out, ".train.lock", "curator train") as lock:  # the next run takes it at once
        assert (out / ".train.lock").read_text().split()[0] == str(os.getpid())
        assert lock.holder() == f"PID {os.getpid()} on {socket.gethostname()}"
    assert not (out / ".train.lock").exists()


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_planted_at_the_lock_path_is_never_written_through(tmp_path: Path, link: str) -> None:
    """A symlink at `.train.lock` had the lock record written into the file it pointed to (issue 49 item 11)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "run"
    out.mkdir()
    lock_path = out / ".train.lock"
    (lock_path.symlink_to if link == "symlink" else lock_path.hardlink_to)(victim)
    with OutputLock(out, ".train.lock", "curator train") as lock:
        assert victim.read_text() == "precious\n"
        assert not lock_path.is_symlink() and lock_path.stat().st_ino != victim.stat().st_ino
        assert lock_path.read_text().split()[0] == str(os.getpid())
        assert lock.holder() is not None
    assert victim.read_text() == "precious\n" and not lock_path.exists()


def test_a_folder_in_the_way_of_the_lock_file_is_a_named_refusal(tmp_path: Path) -> None:
    from training.errors import TrainingError

    (tmp_path / ".train.lock").mkdir()
    with pytest.raises(TrainingError, match="lock file"):
        OutputLock(tmp_path, ".train.lock", "curator train").acquire()
