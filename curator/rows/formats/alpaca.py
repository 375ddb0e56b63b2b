"""Alpaca rows: `instruction`, an optional `input`, and `output`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.table import RowFormat, register


def alpaca(row: Mapping[str, Any]) -> Conversation:
    """Return the user `instruction` (+ `input` after a blank line) and the assistant `output`."""
    prompt = fields.text(row, "instruction")
    extra = row.get("input")
    if extra is not None and not isinstance(extra, str):
        raise MalformedRow("field 'input' is not a string")
    if extra and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    return Conversation([("user", prompt), ("assistant", fields.text(row, "output"))])


register(RowFormat("alpaca", alpaca, columns=(frozenset({"instruction", "input", "output"}),
                                           frozenset({"instruction", "output"})), rank=130))
