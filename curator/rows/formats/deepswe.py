"""DeepSWE/R2E-style trajectories: `messages` whose actions are `<function=...>` blocks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.chat import chat_turns
from curator.rows.formats.conversation import Conversation, Turn
from curator.rows.formats.tools import pair_tool_turns, tool_call
from curator.rows.formats.table import RowFormat, register


_FUNCTION_BLOCK = re.compile(r"<function=([\w.\-]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([\w.\-]+)>(.*?)</parameter>", re.S)


def deepswe(row: Mapping[str, Any]) -> Conversation:
    """Return a DeepSWE/R2E-style `messages` trajectory with its `<function=NAME><parameter=K>V</parameter>
    </function>` actions as tool calls and the observation after each action as that call's tool turn;
    the tools offered are the functions the trajectory calls (string parameters)."""
    base = chat_turns(fields.required(row, "messages"), "messages")
    out = Conversation()
    seen: dict[str, set[str]] = {}
    pending: str | None = None  # the id of the call whose observation comes next
    n_calls = 0
    for turn in base:
        role, content = turn
        if role == "assistant" and (blocks := _FUNCTION_BLOCK.findall(content)):
            calls = []
            for name, body in blocks[:1]:  # one action per step, as the agent executes it
                args = {k: v.strip("\n") for k, v in _PARAMETER.findall(body)}
                seen.setdefault(name, set()).update(args)
                calls.append(tool_call(name, args, f"call_{n_calls}"))
                n_calls += 1
            text = _FUNCTION_BLOCK.sub("", content).strip()
            out.append(Turn("assistant", text, tool_calls=calls))
            pending = calls[0]["id"]
        elif role == "user" and pending is not None:
            out.append(Turn("tool", content, tool_call_id=pending))
            pending = None
        else:
            out.append(turn)
            pending = None
    out.tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {k: {"type": "string"} for k in sorted(keys)}}}} for n, keys in seen.items()] or None
    return pair_tool_turns(out)


# Agentic trajectories: each observation depends on the actions before it, so only the final
# answer can be regenerated faithfully.
register(RowFormat("deepswe", deepswe, turns="last"))
