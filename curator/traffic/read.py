"""Reading a traffic sample: request logs, a mix folder, or parquet/JSONL with `messages`.

Request logs are what OpenAI-compatible servers and gateways record, one request a line:
the chat request itself (`{"model", "messages", "tools"?, ...}`), the same wrapped by a
request-log middleware (`{"body": {...}, "headers": ..., ...}`, body as an object or as JSON
text), or a completions request (`{"prompt": "..."}`, read as one user turn). Files with
another conversation schema (ShareGPT `conversations`, ...) are read by the mix's own format
detection. A mix folder (one with `.curator/manifest.json`) is read through `open_mix`.

Every record yields a TrafficRow or a BrokenRow saying why it could not be read: malformed
records are counted by the caller, never fatal, and no reason quotes the record's text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curator.rows.formats.conversation import MalformedRow, as_messages
from curator.rows.formats.table import FORMATS, detect_format
from curator.rows.readers import BrokenRow, local_files, reader_for
from curator.rows.schema import MixRow, is_mix, open_mix
from curator.rows.formats.traffic import unwrap_request
from training.io.text import is_valid_unicode


@dataclass(frozen=True)
class TrafficRow:
    """One request of the traffic: its prompt messages ({role, content, tool_calls?, ...}), the tools it
    declares (OpenAI shape, or None), and where it came from (file and record number, or mix row id)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    where: str


def parse_request(record: Mapping[str, Any], where: str) -> TrafficRow | BrokenRow:
    """Return the request in one log record (or any row with a conversation), or a BrokenRow saying why not."""
    request = unwrap_request(dict(record))
    if "messages" in request or isinstance(request.get("prompt"), str):
        fmt, row = "traffic", request  # build-mix's `format: traffic` reads it the same way
    else:
        detected = detect_format(request.keys())
        if detected is None:
            return BrokenRow(f"no messages in the record ({where})")
        fmt, row = detected, request
    try:
        conv = FORMATS[fmt].normalise(row)
    except MalformedRow as exc:
        return BrokenRow(f"{exc} ({where})")
    if not any(role == "user" for role, _ in conv):
        return BrokenRow(f"no user turn ({where})")
    if not all(is_valid_unicode(text) for _, text in conv) or not is_valid_unicode(repr(conv.tools)):
        return BrokenRow(f"text is not valid Unicode (a lone surrogate) ({where})")  # it could be written nowhere
    return TrafficRow(as_messages(conv), conv.tools, where)


def _mix_rows(path: Path) -> Iterator[TrafficRow | BrokenRow]:
    for row in open_mix(path).rows():
        if isinstance(row, MixRow):
            yield TrafficRow(row.messages, row.tools, f"{path.name}:{row.id}")
        else:
            yield BrokenRow(f"{row.reason} ({path.name}:{row.id})")


def iter_traffic(path: str | Path) -> Iterator[TrafficRow | BrokenRow]:
    """Yield every request in a traffic file, a folder of them, or a mix folder; a BrokenRow per unreadable one.

    A missing path or a folder without data files is a ConfigError (from `local_files`).
    """
    path = Path(path)
    if is_mix(path):
        yield from _mix_rows(path)
        return
    for file in local_files(path):
        for n, record in enumerate(reader_for(file)(file), 1):
            where = f"{file.name} record {n}"
            if isinstance(record, BrokenRow):
                yield record
            else:
                yield parse_request(record, where)
