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
