"""The generation output's shard files: their names, their order, and the reading of their lines.

`curator generate` writes each finished batch of records as one immutable shard named
`shard-NNNNN.jsonl` (the index zero-padded to five digits at least, counting up from 0); everything
that reads a generation output (generate resuming, hidden states, plan, forecast, the trainer's
records) lists the shards and reads their lines here, so that writer and readers agree on which
files are shards and in which order. Temporaries (dot-prefixed, training/io/atomic.py) are never shards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SHARD_GLOB = "shard-*.jsonl"  # as the messages and help texts name the shards
_SHARD_RE = re.compile(r"^shard-(\d{5,})\.jsonl$")


def shard_name(index: int) -> str:
    """Return the file name of the shard of `index` (shard-00000.jsonl, ...)."""
    return f"shard-{index:05d}.jsonl"


def shard_index(name: str) -> int | None:
    """Return the index of a shard's file name, or None when the name is no shard's."""
    found = _SHARD_RE.match(name)
    return int(found.group(1)) if found else None


def shard_paths(gen_dir: str | Path) -> list[Path]:
    """Return the shards of a generation output in index order ([] when `gen_dir` is no directory)."""
    root = Path(gen_dir)
    if not root.is_dir():
        return []
    found = [(i, p) for p in root.iterdir() if (i := shard_index(p.name)) is not None]
    return [p for _, p in sorted(found)]


def record_lines(path: Path) -> Iterator[dict[str, Any] | None]:
    """Yield each non-blank line of a generation output's JSONL file (a shard, errors.jsonl) as its JSON
    object, or None for a line that is none (not UTF-8, not JSON, too deep, not an object): the reader
    counts it as malformed."""
    # Bytes decoded line by line: a byte that is not UTF-8 (a disk error, a hand edit) is one malformed
    # line, not a UnicodeDecodeError that ends the whole read.
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; RecursionError: too deep
                yield None
                continue
            yield record if isinstance(record, dict) else None
