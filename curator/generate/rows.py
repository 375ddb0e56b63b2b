"""Mix rows read from the build-mix parquet files (DIR/*.parquet), checked one by one.

A row that breaks the format is given back as a BadRow with the reason, so the run can count
and record it without stopping. Rows stream in file order; nothing but the ids is held.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from curator.errors import ConfigError
from training.gen_record import tool_call_problem

ROLES = frozenset({"system", "user", "assistant", "tool"})
TURN_POLICIES = frozenset({"all", "last"})
REQUIRED_COLUMNS = ("id", "messages")


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
    """A mix row that cannot be used, with the reason."""

    id: str
    reason: str


def mix_files(mix_dir: str | Path) -> list[Path]:
    """Return the mix's parquet files in order; raise ConfigError when there are none or a
    required column is missing."""
    root = Path(mix_dir)
    if not root.is_dir():
        raise ConfigError(f"mix directory {root} does not exist (make one with `curator build-mix`)")
    files = sorted(root.glob("*.parquet"))
    if not files:
        raise ConfigError(f"mix directory {root} holds no .parquet files")
    for path in files:
        try:
            names = set(pq.read_schema(path).names)
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError(f"mix file {path} is not a readable parquet file ({exc}); rebuild the mix") from None
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise ConfigError(f"mix file {path} lacks column(s) {', '.join(missing)}")
    return files


def iter_mix(mix_dir: str | Path, limit: int | None = None) -> Iterator[MixRow | BadRow]:
    """Yield the first `limit` rows of the mix (all when None), each a MixRow or a BadRow."""
    seen = 0
    for path in mix_files(mix_dir):
        parquet = pq.ParquetFile(path)
        wanted = [c for c in ("id", "source", "category", "messages", "turns", "keep_responses", "tools")
                  if c in parquet.schema_arrow.names]
        for batch in parquet.iter_batches(batch_size=512, columns=wanted):
            for record in batch.to_pylist():
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield parse_row(record, f"{path.name}:{seen}")


def read_mix_ids(mix_dir: str | Path, limit: int | None = None) -> list[str]:
    """Return the ids of the first `limit` rows in mix order (a missing id reads as '')."""
    ids: list[str] = []
    for path in mix_files(mix_dir):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=["id"]):
            for value in batch.column(0).to_pylist():
                if limit is not None and len(ids) >= limit:
                    return ids
                ids.append("" if value is None else str(value))
    return ids


def parse_row(record: dict[str, Any], where: str) -> MixRow | BadRow:
    """Return the MixRow in a parquet record, or a BadRow saying what is wrong with it."""
    row_id = record.get("id")
    if not isinstance(row_id, str) or not row_id:
        return BadRow(id=f"<row {where}>", reason="missing id")
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
    if not keep and not any(m["role"] in ("user", "tool") for m in clean):
        return BadRow(row_id, "no user turn to answer")
    if not keep and turns == "last" and clean[-1]["role"] not in ("user", "tool"):
        return BadRow(row_id, f"turns=last needs the conversation to end in a user or tool turn, not {clean[-1]['role']}")
    tools = record.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
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
        return [len(messages) - 1] if messages[-1]["role"] in ("user", "tool") else []
    points = []
    for i, message in enumerate(messages):
        nxt = messages[i + 1]["role"] if i + 1 < len(messages) else None
        if message["role"] == "user" and nxt != "assistant":
            points.append(i)
        elif message["role"] == "tool" and nxt not in ("assistant", "tool"):
            # Parallel tool results are answered once, after the last of them.
            points.append(i)
    return points
