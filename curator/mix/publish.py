"""Publishing a mix folder whole (training.io.publish: built beside it, swapped in by one rename).

Readers other than `open_mix` (DuckDB's `'MIX/*.parquet'`, pandas, `datasets`) glob the folder and
trust what they find, so the folder must never hold parts of two mixes at once; training.io.publish
says how a folder is published whole, for build-mix and export alike. What is the mix's own here:

A build writes nothing into MIX itself, so it refuses a folder it would have to empty that holds
files it did not write (a folder that is not a mix, or a mix with foreign files added): those are
never deleted. One build at a time holds `.MIX.build-mix.lock` beside the folder (the folder
itself is swapped, so the lock cannot live in it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from curator.errors import ConfigError
from curator.rows.schema import (  # noqa: F401 - HELDOUT_DIR and OLD_LOCK_FILE: the mix's names, read here
    COLUMNS,
    HELDOUT_DIR,
    LEGACY_MANIFEST,
    MANIFEST_DIR,
    MANIFEST_VERSION,
    OLD_LOCK_FILE,
    MixWriter,
    conform,
    foreign_entries,
    is_mix,
)
from training.io.outlock import OutputBusyError, OutputLock
from training.io.publish import Publisher

STAGE_TAG = "build"  # a build's staging folder: `.MIX.build.tmp-PID`


def real_out(out_dir: str | Path) -> Path:
    """Return the folder a build replaces: `out_dir`, or the folder it links to (the link is kept)."""
    out = Path(out_dir)
    return out.resolve() if out.is_symlink() else out


def publisher(out_dir: str | Path) -> Publisher:
    return Publisher.of(out_dir, STAGE_TAG)


def mix_lock(out_dir: str | Path) -> OutputLock:
    """Return the (unacquired) lock that makes one build at a time the writer of a mix folder."""
    out = Path(out_dir).absolute()
    return OutputLock(out.parent, f".{out.name}.build-mix.lock", "`curator build-mix`")


def acquire(out_dir: str | Path) -> OutputLock:
    """Take the mix folder's lock; ConfigError naming the holder's PID when another build holds it."""
    lock = mix_lock(out_dir)
    try:
        return lock.acquire()
    except OutputBusyError:
        raise ConfigError(f"{out_dir} is being written by another `curator build-mix` ({lock.holder() or 'another process'}); "
                          "wait for it to finish or use another --out") from None


@contextmanager
def staged(out_dir: str | Path) -> Iterator[Path]:
    """Publish a mix folder whole: take its lock, clean up after killed builds, refuse an --out holding
    foreign files, and yield the staging folder to write the complete mix into; when the block ends
    the mix is swapped in (an exception removes the staging folder instead). `out_dir` as `real_out` gives it."""
    out = Path(out_dir)
    lock = acquire(out)
    try:
        remove_stale(out)
        check_out(out, is_mix=is_mix(out))
        pub = publisher(out)
        stage = pub.stage
        try:
            yield stage
            swap_in(stage, out)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    finally:
        lock.release()


def staging_dir(out_dir: str | Path) -> Path:
    """Return the sibling folder this process builds the mix in."""
    return publisher(out_dir).stage


def check_out(out_dir: str | Path, is_mix: bool) -> None:
    """Refuse an --out that a build could only replace by deleting what it did not write."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise ConfigError(f"--out {out} holds the current folder, which a build would replace; run from elsewhere")
    foreign = foreign_entries(out)
    if not foreign:
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    what = "holds files build-mix did not write" if is_mix else "is not empty and holds no mix"
    raise ConfigError(f"--out {out} {what} ({shown}); they are never deleted: move them away or choose another --out")


def remove_stale(out_dir: str | Path) -> list[Path]:
    """Clean up after killed builds (hold the lock): restore a mix left renamed aside, remove staging
    folders and old aside copies; return what was removed. Only names builds make are touched."""
    return publisher(out_dir).remove_stale()


def swap_in(stage: Path, out_dir: str | Path) -> None:
    """Make the finished mix in `stage` the folder `out_dir`, and remove the mix it replaces."""
    out = Path(out_dir).absolute()
    if foreign_entries(out):  # checked at the start too; a file added during the build survives as well
        check_out(out, is_mix=True)
    try:
        publisher(out).swap_in(stage)
    except OSError as exc:
        raise ConfigError(f"cannot put the new mix in place at {out}: {exc.strerror or exc}") from None


def write_tables(out_dir: str | Path, tables: Sequence[pa.Table], name: str) -> dict[str, Any]:
    """Return the manifest of a mix written from ready tables (one part each), published whole.

    For mixes made outside build-mix (benchmarks, test fixtures); the tables should follow SCHEMA.
    """
    out = real_out(out_dir)
    with staged(out) as stage:
        writer = MixWriter(stage, named=out)
        for table in tables:
            writer.write_table(conform(table))
        parts = writer.finish()
        manifest = {"manifest_version": MANIFEST_VERSION, "name": name, "rows": sum(p["rows"] for p in parts),
                    "columns": list(COLUMNS), "parts": parts}
        writer.publish(manifest)
    return manifest
