"""ShareGPT rows (`conversations` of {from, value}), and Hermes function calling in the same shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.chat import chat_turns
from curator.rows.formats.conversation import Conversation
from curator.rows.formats.table import RowFormat, register


def sharegpt(row: Mapping[str, Any]) -> Conversation:
    """Return the turns of `conversations` ({from, value}; human/gpt/chatgpt/bing/bard/system; Hermes tool blocks parsed)."""
    return chat_turns(fields.required(row, "conversations"), "conversations", row.get("tools"))


register(RowFormat("sharegpt", sharegpt, columns=(frozenset({"conversations"}),), rank=80))
# Hermes function-calling rows are ShareGPT turns whose tool blocks the chat reader takes out
register(RowFormat("hermes", sharegpt, aliases=("hermes-function-calling",)))
