"""Row formats: each normaliser turns one dataset row into a conversation of (role, content) turns.

Roles out are system, user, assistant, tool. A row that does not fit its format raises
MalformedRow with a short reason (counted per source, never fatal).

Where the source has structure (OpenAI-style messages, glaive, xlam/APIGen, Hermes function
calling, DeepSWE-style `<function=...>` trajectories) it is kept: the conversation carries the
`tools` offered (JSON schemas, OpenAI shape), assistant turns their `tool_calls` (OpenAI shape:
id, type "function", function name, arguments as JSON text of an object) and tool turns the
`tool_call_id` and function `name` of the call they answer, so the target's own chat template can
render them in its own tool-call tokens. A call whose arguments are not a JSON object, or a tool
turn that answers no call, makes the row malformed. Sources without structure keep tool calls as
text (`render_tool_calls`): the fallback, never the rule.

This module holds the types every format shares and the turn policy; `table.py` the format table;
`fields.py` and `tools.py` what several formats read the same way; every other module is one format.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Turn(tuple):
    """One message: unpacks and compares as (role, content); tool_calls, tool_call_id, name where the source has them."""

    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    name: str | None

    def __new__(cls, role: str, content: str, *, tool_calls: list[dict[str, Any]] | None = None,
                tool_call_id: str | None = None, name: str | None = None) -> Turn:
        turn = super().__new__(cls, (role, content))
        turn.tool_calls = tool_calls or None
        turn.tool_call_id = tool_call_id
        turn.name = name
        return turn

    def as_dict(self) -> dict[str, Any]:
        """Return the message as the mix stores it ({role, content} plus the tool fields it has)."""
        out: dict[str, Any] = {"role": self[0], "content": self[1]}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


Message = tuple[str, str]


class Conversation(list):
    """A list of turns ((role, content) tuples or Turns) and the `tools` offered (None: no structured tools)."""

    tools: list[dict[str, Any]] | None = None

    def __init__(self, turns: Iterable[Message] = (), tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(turns)
        self.tools = tools or None

    def has_tools(self) -> bool:
        """Return whether the conversation carries structured tools or tool calls."""
        return bool(self.tools) or any(getattr(t, "tool_calls", None) for t in self)


class MalformedRow(Exception):
    """A row that does not fit its source's format; the message is the (short) reason."""


class SkippedRow(Exception):
    """A whole row that its format turns into no conversation (counted as filtered, with this reason)."""


def to_prompt(conv: Conversation, turns: str, keep_responses: bool) -> Conversation:
    """Return the conversation the mix stores for a turn policy (see CONTRACTS §1), tools kept.

    With turns=all the source's assistant turns are dropped (the target answers in their place);
    tool turns stay, each naming the call it answered, so the target's own calls can be paired
    with the source's results by position when the conversation is regenerated.
    """
    tools = getattr(conv, "tools", None)
    if not any(role == "user" for role, _ in conv):
        raise MalformedRow("no user turn")
    if keep_responses:
        if not any(role == "assistant" for role, _ in conv):
            raise MalformedRow("keep_responses but no assistant turn")
        return Conversation(conv, tools=tools)
    if turns == "all":
        return Conversation([m for m in conv if m[0] != "assistant"], tools=tools)
    last = max(i for i, (role, _) in enumerate(conv) if role in ("user", "tool"))
    return Conversation(conv[: last + 1], tools=tools)


def as_messages(conv: Conversation) -> list[dict[str, Any]]:
    """Return the turns as message dicts ({role, content} plus tool_calls / tool_call_id / name where present)."""
    return [t.as_dict() if isinstance(t, Turn) else {"role": t[0], "content": t[1]} for t in conv]
