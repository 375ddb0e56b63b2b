"""Atomic file writes: readers see the old file or the whole new one, never a part.

The standard library only (no torch), so that the data side imports it without the model side.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

from training.errors import TrainingError
from training.io.diskspace import named_disk_full

# Every temporary name holds this mark, so a sweep can tell leftovers of a crash from data.
TMP_MARK = ".tmp-"


class OutputPathError(TrainingError):
    """An output path that must not be written: a block device, a socket, a folder, or a folder
    reached through a link that leads outside the output."""


def _in_place_target(path: Path) -> bool:
    """Return True when `path` is a character device or a FIFO (written in place, never renamed over);
    raise OutputPathError for another kind of non-regular file. False: a regular file, a link, or nothing."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return False  # a link itself is replaced by the rename, never written through
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return True  # /dev/null, /dev/stdout, a pipe: written into, as a shell redirection would
    kind = "a folder" if stat.S_ISDIR(mode) else "a block device" if stat.S_ISBLK(mode) else "not a regular file"
    raise OutputPathError(f"{path} is {kind}; give a file path to write")


def write_bytes(path: str | Path, data: bytes, *, fsync: bool = True) -> Path:
    """Write `data` to `path` (parents created) through a temp file in its folder and a rename.

    A character device or a FIFO at `path` (`/dev/null`, `/dev/stdout`, a pipe) is written in place,
    never replaced; a block device, a socket or a folder is refused (OutputPathError).
    """
    path = Path(path)
    if _in_place_target(path):
        with open(path, "wb") as f:
            f.write(data)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        with named_disk_full(path.parent), open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sweep_dead_temps(path)
    return path


def current_umask() -> int:
    """Return the process's umask without changing it (Linux reports it in /proc; elsewhere it is set and put back)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # the only portable read; put back at once
    os.umask(mask)
    return mask


def give_default_mode(path: str | Path) -> Path:
    """Give `path` the mode a plain open() would have (0666 less the umask), and return it.

    Writers that make their own temporary file (safetensors' save_file, the tempfile module) create it
    0600 and rename it into place, so the weights end up readable by their owner alone, beside a
    0644 config.json: a serving engine running as another user cannot load them.
    """
    os.chmod(path, 0o666 & ~current_umask())
    return Path(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def sweep_dead_temps(path: str | Path) -> list[Path]:
    """Remove the temporaries of `path` (`.NAME.tmp-PID-hex`) left by writers that died (SIGKILL between
    writing and the rename); a live writer's are kept. Return what was removed."""
    path = Path(path)
    prefix = f".{path.name}{TMP_MARK}"
    removed: list[Path] = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        pid_text, _, tag = entry.name[len(prefix):].partition("-") if entry.name.startswith(prefix) else ("", "", "")
        if not (pid_text.isdigit() and len(tag) == 6 and all(c in "0123456789abcdef" for c in tag)):
            continue
        if int(pid_text) != os.getpid() and not _alive(int(pid_text)) and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def write_text(path: str | Path, text: str, *, fsync: bool = True) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_json(path: str | Path, obj: Any, *, fsync: bool = True, **dumps: Any) -> Path:
    """Write `obj` as JSON (`json.dumps(obj, **dumps)`) to `path` atomically."""
    return write_text(path, json.dumps(obj, **dumps), fsync=fsync)


def _refuse_link(path: Path, what: str) -> None:
    """Raise OutputPathError when `path` itself is a link (dangling or not): writing there would land
    wherever the link points, outside the output."""
    if path.is_symlink():
        raise OutputPathError(f"{path} is a link to {os.readlink(path)}; {what} is never "
                              "followed through a link: remove it, or pick another --out")


def output_folder(root: str | Path, name: str) -> Path:
    """Return `root/name`, created, after checking that it is a folder of its own inside `root`.

    A link planted at `root/name` (or above it, inside `root`) would send every write into the folder
    it points to: refused with OutputPathError, naming the link.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = root
    for part in Path(name).parts:  # each level checked before anything is created under it
        folder = folder / part
        _refuse_link(folder, "an output folder")
        folder.mkdir(exist_ok=True)
    if not folder.resolve().is_relative_to(root.resolve()):
        raise OutputPathError(f"{folder} leads to {folder.resolve()}, outside {root}; an output folder is never "
                              "followed through a link: remove the link, or pick another --out")
    return folder


def output_file(root: str | Path, name: str) -> Path:
    """Return `root/name` after checking that neither it nor a folder above it inside `root` is a link.

    For a file that is appended to or written in place (a log, `metrics.jsonl`, `errors.jsonl`): an
    atomic write renames over a link, but `open(path, "a")` writes through it. The folders above it
    are created, as `output_folder` does; the file is not.
    """
    path = Path(root) / name
    output_folder(root, str(Path(name).parent))
    _refuse_link(path, "a file in an output folder")
    return path


def fsync_path(path: str | Path) -> None:
    """Flush a file, or a folder's entries (so that a rename in it survives a power cut), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
