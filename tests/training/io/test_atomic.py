"""Atomic writes: the old file or the whole new one, and no temp file left after a failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.io import atomic


def test_writes_replace_whole_files_and_create_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "x.json"
    atomic.write_json(path, {"k": 1}, indent=2)
    atomic.write_json(path, {"k": 2})
    assert json.loads(path.read_text()) == {"k": 2}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.txt"
    atomic.write_text(path, "old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic.write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def _char_device(path: Path) -> Path:
    """A node like /dev/null (major 1, minor 3) in a test folder, so that nothing real is at risk."""
    import os
    import stat

    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD; the FIFO case below covers the code path")
    return path


def test_a_character_device_or_fifo_is_written_in_place_never_replaced(tmp_path: Path, capsys) -> None:
    """`profile --out /dev/null` (as root) once replaced /dev/null with a regular file (issue 38 item 3)."""
    import os
    import stat
    import threading

    from curator.cli import main
    from curator.traffic.synthetic import write_jsonl

    null = _char_device(tmp_path / "null")
    atomic.write_json(null, {"k": 1})
    assert stat.S_ISCHR(os.lstat(null).st_mode) and [p.name for p in tmp_path.iterdir()] == ["null"]
    write_jsonl(tmp_path / "t.jsonl", 50, {"chat": 1.0}, seed=1)
    assert main(["profile", "--traffic", str(tmp_path / "t.jsonl"), "--out", str(null)]) == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic.write_json(fifo, {"k": 2})
    reader.join(10)
    assert got == [b'{"k": 2}'] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "pipe", "t.jsonl"]  # no temporary left


def test_a_folder_or_socket_at_an_output_path_is_refused_by_name(tmp_path: Path) -> None:
    import socket

    (tmp_path / "d").mkdir()
    with pytest.raises(atomic.OutputPathError, match="is a folder"):
        atomic.write_text(tmp_path / "d", "x")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s"))
        with pytest.raises(atomic.OutputPathError, match="not a regular file"):
            atomic.write_text(tmp_path / "s", "x")
    finally:
        sock.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "s"]


def test_an_output_folder_is_never_followed_through_a_link(tmp_path: Path) -> None:
    """A symlinked `subset-0.125` once sent forecast's index.json and meta.json elsewhere (issue 38 item 4)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "subset-0.125").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(atomic.OutputPathError, match="subset-0.125 is a link"):
        atomic.output_folder(out, "subset-0.125")
    (out / "deep").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(atomic.OutputPathError, match="deep is a link"):
        atomic.output_folder(out, "deep/run")
    assert list(elsewhere.iterdir()) == []
    assert atomic.output_folder(out, "run-1").is_dir()


def test_a_file_appended_to_is_never_written_through_a_link(tmp_path: Path) -> None:
    """errors.jsonl and metrics.jsonl, opened with "a", once wrote through a planted link (sweep 2026-12-04 items 3, 4)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "errors.jsonl").symlink_to(elsewhere / "e.jsonl")  # dangling: "a" would create it there
    with pytest.raises(atomic.OutputPathError, match="errors.jsonl is a link"):
        atomic.output_file(out, "errors.jsonl")
    (out / "deep").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(atomic.OutputPathError, match="deep is a link"):
        atomic.output_file(out, "deep/log.jsonl")
    assert list(elsewhere.iterdir()) == []
    assert atomic.output_file(out, "sub/metrics.jsonl") == out / "sub" / "metrics.jsonl" and (out / "sub").is_dir()


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """Killed profiles once left `.p.json.tmp-PID-hex` files behind for good (issue 38 item 12)."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".p.json{atomic.TMP_MARK}{dead.pid}-abc123"
    stale.write_text("half a profile")
    live = tmp_path / f".p.json{atomic.TMP_MARK}1-abc123"  # PID 1 is alive: a writer at work keeps its temporary
    live.write_text("being written")
    mine = tmp_path / "notes.tmp-1-abc123"  # not a temporary of p.json
    mine.write_text("the user's")
    atomic.write_json(tmp_path / "p.json", {"k": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["p.json", live.name, mine.name])


def test_give_default_mode_is_what_a_plain_open_gives(tmp_path: Path) -> None:
    import os
    import tempfile

    before = os.umask(0o027)
    try:
        assert atomic.current_umask() == 0o027
        fd, name = tempfile.mkstemp(dir=tmp_path)  # 0600, whatever the umask
        os.close(fd)
        plain = tmp_path / "plain"
        plain.write_bytes(b"")
        atomic.give_default_mode(name)
    finally:
        os.umask(before)
    assert os.stat(name).st_mode & 0o777 == plain.stat().st_mode & 0o777 == 0o640
    assert atomic.current_umask() == before
