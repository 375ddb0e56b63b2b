"""SWE-agent trajectories (`trajectory` of {role, text})."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.table import RowFormat, register


def swe_agent(row: Mapping[str, Any]) -> Conversation:
    """Return a SWE-agent `trajectory` ({role: system/user/ai, text}); observations stay user turns.

    SWE-agent sends environment observations to the model as user messages and reads its actions
    from the text (no structured calls to keep): what the target will see when it runs the same agent.
    """
    items = fields.required(row, "trajectory")
    if not isinstance(items, list) or not items:
        raise MalformedRow("field 'trajectory' is not a non-empty list")
    conv = Conversation()
    for item in items:
        if not isinstance(item, Mapping):
            raise MalformedRow("a trajectory step is not an object")
        role = fields.role(item.get("role"))
        text = item.get("text")
        if role == "system" and not text:
            text = item.get("system_prompt")
        if not isinstance(text, str):
            raise MalformedRow("a trajectory step has no text")
        conv.append((role, text))
    return conv


# Agentic trajectories: each observation depends on the actions before it, so only the final
# answer can be regenerated faithfully.
register(RowFormat("swe-agent", swe_agent, columns=(frozenset({"trajectory"}),), rank=60, turns="last"))
