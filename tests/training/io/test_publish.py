"""training.io.publish: what build-mix and export share when they put a folder in place whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import training.io.publish as folder_publish
from training.io.publish import Publisher


def _folder(path: Path, **files: str) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _only_data(folder: Path) -> bool:
    return all(p.name == "data.txt" for p in folder.iterdir())


@pytest.mark.parametrize("can_exchange", [True, False])
def test_a_staged_folder_replaces_the_old_one_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    can_exchange: bool) -> None:
    out = _folder(tmp_path / "out", **{"data.txt": "old", "old-only.txt": "x"})
    if not can_exchange:
        monkeypatch.setattr(folder_publish, "exchange", lambda a, b: False)
    pub = Publisher.of(out, "write")
    with pub.staged() as stage:
        (stage / "data.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["data.txt"] and (out / "data.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # neither the stage nor the old copy is left


def test_a_failed_write_leaves_the_old_folder_and_no_stage(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", **{"data.txt": "old"})
    with pytest.raises(RuntimeError):
        with Publisher.of(out, "write").staged() as stage:
            (stage / "data.txt").write_text("half")
            raise RuntimeError("killed mid-write")
    assert (out / "data.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_second_rename_puts_the_old_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _folder(tmp_path / "out", **{"data.txt": "old"})
    monkeypatch.setattr(folder_publish, "exchange", lambda a, b: False)
    real = os.rename

    def rename(src: object, dst: object) -> None:
        if Path(str(dst)) == out and ".write.tmp-" in str(src):
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError):
        with Publisher.of(out, "write").staged() as stage:
            (stage / "data.txt").write_text("new")
    assert (out / "data.txt").read_text() == "old"


def test_leftovers_are_restored_or_removed_and_a_users_folder_by_those_names_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"  # missing: a writer was killed between its two renames
    aside = _folder(tmp_path / ".out.old.tmp-111", **{"data.txt": "the earlier folder"})
    stage = _folder(tmp_path / ".out.write.tmp-222", **{"data.txt": "half"})
    users = _folder(tmp_path / ".out.write.tmp-333", **{"notes.md": "mine"})  # not the writer's files
    not_a_pid = _folder(tmp_path / ".out.write.tmp-backup", **{"data.txt": "mine too"})
    other = _folder(tmp_path / ".other.write.tmp-222", **{"data.txt": "another output's"})
    removed = Publisher.of(out, "write", owns=_only_data).remove_stale()
    assert (out / "data.txt").read_text() == "the earlier folder" and not aside.exists()
    assert removed == [stage] and not stage.exists()
    assert users.exists() and not_a_pid.exists() and other.exists()
