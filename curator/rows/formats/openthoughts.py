"""OpenThoughts rows: a `system` prompt beside ShareGPT `conversations`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.sharegpt import sharegpt
from curator.rows.formats.table import RowFormat, register


def openthoughts(row: Mapping[str, Any]) -> Conversation:
    """Return `system` plus the ShareGPT `conversations`."""
    system = row.get("system")
    if system is not None and not isinstance(system, str):
        raise MalformedRow("field 'system' is not a string")
    conv = sharegpt(row)
    return Conversation(([("system", system)] if system and system.strip() else []) + conv, tools=conv.tools)


register(RowFormat("openthoughts", openthoughts, columns=(frozenset({"system", "conversations"}),), rank=70))
