"""Glaive function-calling rows: a `system` with its function definitions and a `chat` of
USER/ASSISTANT/FUNCTION RESPONSE parts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow, Turn
from curator.rows.formats.tools import json_values, pair_tool_turns, tool_call, tool_schema
from curator.rows.formats.table import RowFormat, register


_GLAIVE_MARK = re.compile(r"(?:^|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_GLAIVE_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
# glaive quotes the arguments object in single quotes: {"name": "f", "arguments": '{"a": 1}'}
_GLAIVE_CALL = re.compile(r"""^\s*<functioncall>\s*(\{.*\})\s*$""", re.S)
_GLAIVE_QUOTED_ARGS = re.compile(r"""("arguments"\s*:\s*)'(.*)'(\s*\}\s*)$""", re.S)


def _glaive_call(text: str, index: int) -> dict[str, Any] | None:
    found = _GLAIVE_CALL.match(text)
    if found is None:
        return None
    body = _GLAIVE_QUOTED_ARGS.sub(lambda m: m.group(1) + json.dumps(m.group(2)) + m.group(3), found.group(1))
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
        raise MalformedRow("a <functioncall> is not valid JSON") from None
    if not isinstance(call, Mapping):
        raise MalformedRow("a <functioncall> is not an object")
    return tool_call(call.get("name"), call.get("arguments"), f"call_{index}")


def glaive(row: Mapping[str, Any]) -> Conversation:
    """Return glaive's `system` (its function definitions as `tools`) and the USER/ASSISTANT/FUNCTION
    RESPONSE parts of `chat`, a `<functioncall> {...}` answer as a tool call; `<|endoftext|>` dropped."""
    system = fields.text(row, "system").strip()
    if system.startswith("SYSTEM:"):
        system = system[len("SYSTEM:"):].strip()
    chat = fields.text(row, "chat")
    parts = _GLAIVE_MARK.split(chat)
    if len(parts) < 3:
        raise MalformedRow("field 'chat' has no USER:/ASSISTANT: parts")
    if parts[0].strip():
        raise MalformedRow("field 'chat' has text before its first USER:/ASSISTANT: mark")
    tools = None
    marker = system.find(" -\n")
    if marker >= 0 and "{" in system[marker:]:
        tools = [tool_schema(t) for t in json_values(system[marker:])]
        system = system[:marker].rstrip(" -")
    conv = Conversation([("system", system)] if system else [], tools=tools)
    n_calls = 0
    for mark, body in zip(parts[1::2], parts[2::2]):
        role, text = _GLAIVE_ROLES[mark], body.replace("<|endoftext|>", "").strip()
        call = _glaive_call(text, n_calls) if role == "assistant" and tools else None
        if call is not None:
            n_calls += 1
            conv.append(Turn("assistant", "", tool_calls=[call]))
        else:
            conv.append((role, text))
    return pair_tool_turns(conv)


# Agentic trajectories: each observation depends on the actions before it, so only the final
# answer can be regenerated faithfully.
register(RowFormat("glaive", glaive, columns=(frozenset({"system", "chat"}),), rank=100, turns="last"))
