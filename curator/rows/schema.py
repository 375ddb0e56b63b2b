"""The mix contract: what `curator build-mix` writes and what every reader of a mix reads (docs/mix.md).

A mix folder holds parquet parts and .curator/manifest.json. The manifest is the completion marker: it is
written last, atomically, and names every part with its row count and SHA-256, so a reader sees a
whole mix or refuses the folder. A mix is written whole into a sibling folder and swapped in by one
rename (curator/mix/publish.py), so that readers which glob the folder never see parts of two mixes.

Rows: id, source, category, messages (list of {role, content, tool_calls, tool_call_id, name}),
turns, keep_responses, tools (JSON text of the OpenAI tool schemas offered, or null), source_id
(the row's own id in its source, or null). The turn
policy says which turns the target answers (`answer_points`):

turns=all   every user turn, and the end of every run of tool turns, in order, each with the
            target's own earlier answers as history (the mix stores no assistant turns).
turns=last  the stored context is kept as is; only the final user or tool turn is answered.
keep_responses  the stored assistant turns already are the target's; nothing is answered.

`open_mix` is the one reader (generate, eval and the demo use it); `MixWriter` the one writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from curator.errors import ConfigError
from training.io.atomic import TMP_MARK, fsync_path, write_text
from training.io.diskspace import named_disk_full
from training.records.gen_record import tool_call_problem

# The manifest sits in a hidden folder so that the obvious read-backs of a mix folder see only
# parquet: `datasets.load_dataset("parquet", data_dir=MIX)` skips hidden paths, and DuckDB's
# 'MIX/*.parquet' does not descend into folders.
MANIFEST_DIR = ".curator"
MANIFEST = f"{MANIFEST_DIR}/manifest.json"
LEGACY_MANIFEST = "manifest.json"  # mixes built before the manifest moved
MANIFEST_VERSION = 1
ROLES = frozenset({"system", "user", "assistant", "tool"})
TURN_POLICIES = frozenset({"all", "last"})
ANSWERED_ROLES = ("user", "tool")
REQUIRED_COLUMNS = ("id", "messages")
_HASH_CHARS = 12

TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("type", pa.string()),
                            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
                          ("tool_call_id", pa.string()), ("name", pa.string())])
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("category", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("turns", pa.string()),
        ("keep_responses", pa.bool_()),
        ("tools", pa.string()),  # JSON list of the tools offered (OpenAI shape), null when none
        ("source_id", pa.string()),  # the row's own id in its source (its `id` column, ...), null when it has none
    ]
)
COLUMNS = tuple(f.name for f in SCHEMA)


# ---- rows and the turn policy ----------------------------------------------------------------


@dataclass
class MixRow:
    """One prompt conversation of the mix and how it is to be answered."""

    id: str
    source: str
    category: str
    messages: list[dict[str, Any]]
    turns: str = "all"
    keep_responses: bool = False
    tools: list[dict[str, Any]] | None = None  # JSON schemas of the tools offered (OpenAI shape)


@dataclass
class BadRow:
    """A mix row that cannot be used, with the reason (`id` is a position key when the row has none)."""

    id: str
    reason: str


def row_key(value: Any, part: str, index: int) -> str:
    """Return the key a row is known by: its id, or its position when the id is null or empty."""
    if isinstance(value, str) and value:
        return value
    return f"<row {index} of {part}: no id>"


def parse_row(record: dict[str, Any], key: str) -> MixRow | BadRow:
    """Return the MixRow in a parquet record, or a BadRow saying what is wrong with it (under `key`)."""
    row_id = record.get("id")
    if not isinstance(row_id, str) or not row_id:
        return BadRow(key, "missing id")
    turns = record.get("turns") or "all"
    if turns not in TURN_POLICIES:
        return BadRow(row_id, f"turns must be 'all' or 'last', not {turns!r}")
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return BadRow(row_id, "no messages")
    clean: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return BadRow(row_id, f"message {i} is not a {{role, content}} struct")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            return BadRow(row_id, f"message {i} has role {role!r} (expected one of {', '.join(sorted(ROLES))})")
        if content is None:
            content = ""
        if not isinstance(content, str):
            return BadRow(row_id, f"message {i} content is not text")
        problem, tidy = _tool_fields(message)
        if problem:
            return BadRow(row_id, f"message {i}: {problem}")
        clean.append({"role": role, "content": content, **tidy})
    keep = bool(record.get("keep_responses") or False)
    if keep and not any(m["role"] == "assistant" for m in clean):
        return BadRow(row_id, "keep_responses is set but the conversation has no assistant message")
    if not keep and not any(m["role"] in ANSWERED_ROLES for m in clean):
        return BadRow(row_id, "no user turn to answer")
    if not keep and turns == "last" and clean[-1]["role"] not in ANSWERED_ROLES:
        return BadRow(row_id, f"turns=last needs the conversation to end in a user or tool turn, not {clean[-1]['role']}")
    tools = record.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except (ValueError, RecursionError):
            return BadRow(row_id, "tools is not valid JSON")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return BadRow(row_id, "tools is not a list of JSON schemas")
    row = MixRow(
        id=row_id,
        source=str(record.get("source") or ""),
        category=str(record.get("category") or ""),
        messages=clean,
        turns=turns,
        keep_responses=keep,
        tools=tools or None,
    )
    if not keep and not answer_points(row):
        return BadRow(row_id, "no unanswered user turn")
    return row


def _tool_fields(message: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Return (what is wrong, the message's tool fields that are set: tool_calls, tool_call_id, name)."""
    tidy: dict[str, Any] = {}
    calls = message.get("tool_calls")
    if calls:
        if message.get("role") != "assistant":
            return "only assistant messages carry tool calls", {}
        for call in calls:
            problem = tool_call_problem(call)
            if problem:
                return problem, {}
        tidy["tool_calls"] = [{"id": c["id"], "type": "function",
                               "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                              for c in calls]
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            tidy[key] = message[key]
    return None, tidy


def answer_points(row: MixRow) -> list[int]:
    """Return the indices of the messages after which the target answers (empty for
    keep_responses rows and for conversations with nothing left to answer)."""
    messages = row.messages
    if row.keep_responses:
        return []
    if row.turns == "last":
        return [len(messages) - 1] if messages[-1]["role"] in ANSWERED_ROLES else []
    points = []
    for i, message in enumerate(messages):
        nxt = messages[i + 1]["role"] if i + 1 < len(messages) else None
        if message["role"] == "user" and nxt != "assistant":
            points.append(i)
        elif message["role"] == "tool" and nxt not in ("assistant", "tool"):
            # Parallel tool results are answered once, after the last of them.
            points.append(i)
    return points


def first_context(row: MixRow) -> list[dict[str, str]]:
    """Return the context of the row's first answer: what a decoder is prompted with to measure it.

    turns=all: up to the first turn the target answers; turns=last: the whole stored context; a
    keep_responses row: what precedes its first (all) or last run of (last) kept answers.
    """
    messages = row.messages
    if row.keep_responses:
        if row.turns == "last":
            end = len(messages)
            while end and messages[end - 1]["role"] == "assistant":
                end -= 1
            return messages[:end]
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        return messages[:first]
    points = answer_points(row)
    return messages[: points[0] + 1] if points else []


# ---- writing ---------------------------------------------------------------------------------


def _table(rows: Sequence[tuple[str, str, str, Any, str, bool, str | None]]) -> pa.Table:
    """Return the rows as a table of SCHEMA; a row's turns may carry tool fields (mix.formats.Turn)."""
    # Built column-wise: much faster than from_pylist on nested dicts.
    offsets = [0]
    roles: list[str] = []
    contents: list[str] = []
    calls: list[Any] = []
    call_ids: list[str | None] = []
    names: list[str | None] = []
    for row in rows:
        for turn in row[3]:
            roles.append(turn[0])
            contents.append(turn[1])
            calls.append(getattr(turn, "tool_calls", None))
            call_ids.append(getattr(turn, "tool_call_id", None))
            names.append(getattr(turn, "name", None))
        offsets.append(len(roles))
    messages = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(roles, pa.string()), pa.array(contents, pa.string()), pa.array(calls, pa.list_(TOOL_CALL_TYPE)),
             pa.array(call_ids, pa.string()), pa.array(names, pa.string())],
            fields=list(MESSAGE_TYPE),
        ),
    )
    tools = [json.dumps(t, ensure_ascii=False) if (t := getattr(r[3], "tools", None)) else None for r in rows]
    return pa.Table.from_arrays(
        [
            pa.array([r[0] for r in rows], pa.string()),
            pa.array([r[1] for r in rows], pa.string()),
            pa.array([r[2] for r in rows], pa.string()),
            messages,
            pa.array([r[4] for r in rows], pa.string()),
            pa.array([r[5] for r in rows], pa.bool_()),
            pa.array(tools, pa.string()),
            pa.array([r[6] for r in rows], pa.string()),
        ],
        schema=SCHEMA,
    )


def sha256_file(path: Path) -> str:
    """Return the hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class _Part:
    tmp: Path
    index: int
    rows: int
    sha256: str

    @property
    def name(self) -> str:
        return f"part-{self.index:05d}-{self.sha256[:_HASH_CHARS]}.parquet"


class MixWriter:
    """Writes a mix into a folder of its own (a build's staging folder, see curator/mix/publish.py):
    parts under temporary names, then `publish` (parts renamed, manifest last)."""

    def __init__(self, out_dir: str | Path, rows_per_part: int = 50_000, *, named: str | Path | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.named = Path(named) if named is not None else self.out_dir  # the folder errors name (the mix, not its staging)
        self.rows_per_part = rows_per_part
        self.buffer: list[tuple[str, str, str, Any, str, bool, str | None]] = []
        self.parts: list[_Part] = []

    def add(self, row: tuple[str, str, str, Any, str, bool, str | None]) -> None:
        """Queue one row (id, source, category, [(role, content)], turns, keep_responses, source_id)."""
        self.buffer.append(row)
        if len(self.buffer) >= self.rows_per_part:
            self._flush()

    def _flush(self) -> None:
        if self.buffer:
            self.write_table(_table(self.buffer))
            self.buffer = []

    def write_table(self, table: pa.Table) -> None:
        """Write a whole table as the next part (temporary name, fsynced, hashed)."""
        index = len(self.parts)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.out_dir / f".part-{index:05d}.parquet{TMP_MARK}{os.getpid()}"
        try:
            with named_disk_full(self.named):
                pq.write_table(table, tmp, compression="zstd")
                fsync_path(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.parts.append(_Part(tmp, index, table.num_rows, sha256_file(tmp)))

    def finish(self) -> list[dict[str, Any]]:
        """Flush what is left; return the parts' manifest entries (file, rows, sha256)."""
        self._flush()
        return [{"file": p.name, "rows": p.rows, "sha256": p.sha256} for p in self.parts]

    def publish(self, manifest: dict[str, Any]) -> None:
        """Rename the parts to their content-addressed names, then write the manifest (the folder is a mix)."""
        for part in self.parts:
            os.replace(part.tmp, self.out_dir / part.name)
        fsync_path(self.out_dir)
        write_text(self.out_dir / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        fsync_path(self.out_dir)


def conform(table: pa.Table) -> pa.Table:
    """Return `table` in SCHEMA: columns and message fields it lacks become nulls."""
    if table.schema.equals(SCHEMA):
        return table
    return pa.Table.from_pylist(table.to_pylist(), schema=SCHEMA)


# ---- reading ---------------------------------------------------------------------------------


HELDOUT_DIR = ".heldout"
OLD_LOCK_FILE = ".build-mix.lock"  # the lock's place inside the folder before builds swapped folders
# What a build writes into a mix folder, and what earlier builds left there (temporaries, parts).
_OURS = re.compile(r"part-\d{5}-[0-9a-f]{12}\.parquet|\.part-\d{5}\.parquet\.tmp-\d+")
_OUR_NAMES = frozenset({MANIFEST_DIR, LEGACY_MANIFEST, HELDOUT_DIR, OLD_LOCK_FILE})


def foreign_entries(out_dir: str | Path) -> list[str]:
    """Return the names in a mix folder that no build wrote (sorted); [] for a missing folder."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name not in _OUR_NAMES and not _OURS.fullmatch(p.name))


def is_mix(path: str | Path) -> bool:
    """Return whether `path` is a mix folder (it has a manifest, or the manifest of mixes built before it moved)."""
    path = Path(path)
    return path.is_dir() and ((path / MANIFEST).is_file() or (path / LEGACY_MANIFEST).is_file())


def _rebuild_hint(root: Path, manifest: dict[str, Any] | None = None) -> str:
    hint = f"rebuild it with `curator build-mix --recipe RECIPE.yaml --out {root}`"
    if manifest and isinstance(manifest.get("name"), str):
        hint += f" (RECIPE.yaml: the recipe of mix {manifest['name']!r})"
    return hint


def _load_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not path.exists() and (root / LEGACY_MANIFEST).exists():
        path = root / LEGACY_MANIFEST
    if not root.is_dir():
        raise ConfigError(f"mix directory {root} does not exist (make one with `curator build-mix`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        foreign = foreign_entries(root)
        if foreign:  # not a mix at all (a sources folder, say): build-mix would refuse it as --out
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise ConfigError(
                f"{root} is not a mix (it holds {shown}, and no {MANIFEST}); build one into a new folder with "
                "`curator build-mix --recipe RECIPE.yaml --out MIX` and pass --mix MIX"
            ) from None
        raise ConfigError(
            f"{root} holds no finished mix (no {MANIFEST}: the build was interrupted or never ran); {_rebuild_hint(root)}"
        ) from None
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is damaged ({exc}); {_rebuild_hint(root)}") from None
    parts = data.get("parts") if isinstance(data, dict) else None
    if not isinstance(parts, list) or not all(
        isinstance(p, dict) and isinstance(p.get("file"), str) and isinstance(p.get("rows"), int)
        and isinstance(p.get("sha256"), str) and "/" not in p["file"] and not p["file"].startswith(".")
        for p in parts
    ):
        raise ConfigError(f"{path} does not name its parts with rows and sha256 (an older or damaged mix); {_rebuild_hint(root)}")
    return data


@dataclass
class Mix:
    """A finished mix, checked against its manifest: the parts it names, in order, and their rows."""

    root: Path
    manifest: dict[str, Any]
    files: list[Path]

    def _batches(self, columns: Sequence[str], batch_size: int) -> Iterator[tuple[str, int, list[dict[str, Any]]]]:
        for path in self.files:
            parquet = pq.ParquetFile(path)
            wanted = [c for c in columns if c in parquet.schema_arrow.names]
            start = 0
            for batch in parquet.iter_batches(batch_size=batch_size, columns=wanted):
                records = batch.to_pylist()
                yield path.name, start, records
                start += len(records)

    def rows(self, limit: int | None = None) -> Iterator[MixRow | BadRow]:
        """Yield the first `limit` rows (all when None), each a MixRow or a BadRow."""
        seen = 0
        for part, start, records in self._batches(COLUMNS, 512):
            for i, record in enumerate(records):
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield parse_row(record, row_key(record.get("id"), part, start + i))

    def ids(self, limit: int | None = None) -> list[str]:
        """Return the keys of the first `limit` rows in mix order (ids; a position for a row without one)."""
        keys: list[str] = []
        for part, start, records in self._batches(("id",), 65536):
            for i, record in enumerate(records):
                if limit is not None and len(keys) >= limit:
                    return keys
                keys.append(row_key(record.get("id"), part, start + i))
        return keys


def open_mix(mix_dir: str | Path, *, verify: bool = True) -> Mix:
    """Return the finished mix in `mix_dir`; ConfigError (saying how to rebuild) for anything else.

    The manifest must name every part with its rows and SHA-256; with `verify`, each part's bytes
    are hashed and compared, so an interrupted or mixed-up folder is never read as a mix.
    """
    root = Path(mix_dir)
    manifest = _load_manifest(root)
    files = []
    for entry in manifest["parts"]:
        path = root / entry["file"]
        if not path.is_file():
            raise ConfigError(f"{path}, named in {MANIFEST}, is missing; {_rebuild_hint(root, manifest)}")
        if verify and sha256_file(path) != entry["sha256"]:
            raise ConfigError(f"{path} does not match its SHA-256 in {MANIFEST} (changed after the build); "
                              f"{_rebuild_hint(root, manifest)}")
        try:
            names = set(pq.read_schema(path).names)
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError(f"mix file {path} is not a readable parquet file ({exc}); {_rebuild_hint(root, manifest)}") from None
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise ConfigError(f"mix file {path} lacks column(s) {', '.join(missing)}")
        files.append(path)
    return Mix(root, manifest, files)


def read_manifest(mix_dir: str | Path) -> dict[str, Any]:
    """Return a finished mix's manifest (its parts checked); ConfigError if the folder holds no finished mix."""
    return open_mix(mix_dir).manifest
