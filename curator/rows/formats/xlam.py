"""xlam/APIGen rows: a `query`, the JSON `tools` offered, and the `answers` as tool calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow, Turn
from curator.rows.formats.tools import calls_of, tool_schema
from curator.rows.formats.table import RowFormat, register


def xlam(row: Mapping[str, Any]) -> Conversation:
    """Return the user `query` with the JSON `tools` offered and the `answers` as the assistant's tool calls."""
    query = fields.text(row, "query")
    tools = fields.json_value(row, "tools")
    answers = fields.json_value(row, "answers")
    if not isinstance(tools, list) or not isinstance(answers, list):
        raise MalformedRow("fields 'tools'/'answers' are not JSON lists")
    return Conversation([("user", query), Turn("assistant", "", tool_calls=calls_of(answers, 0))],
                        tools=[tool_schema(t) for t in tools])


register(RowFormat("xlam", xlam, columns=(frozenset({"query", "tools", "answers"}),), rank=110, aliases=("apigen",)))
