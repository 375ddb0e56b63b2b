"""OpenAI-style rows (`messages` of {role, content}, with tool_calls, tool_call_id and `tools`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.chat import chat_turns
from curator.rows.formats.conversation import Conversation
from curator.rows.formats.table import RowFormat, register


def messages(row: Mapping[str, Any]) -> Conversation:
    """Return the turns of `messages` ({role, content}; OpenAI tool_calls, tool_call_id and `tools` kept)."""
    return chat_turns(fields.required(row, "messages"), "messages", row.get("tools"))


register(RowFormat("messages", messages, columns=(frozenset({"messages"}),), rank=90))
