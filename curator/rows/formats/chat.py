"""Chat turns as ShareGPT ({from, value}) and OpenAI ({role, content}) list them, read into a
conversation: OpenAI tool calls kept, Hermes function-calling blocks taken out of the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow, Turn
from curator.rows.formats.tools import calls_of, offered_tools, json_values, pair_tool_turns, tool_schema


def chat_turns(items: Any, key: str, tools: Any = None) -> Conversation:
    """Return a conversation from a list of {from, value} or {role, content} items (OpenAI tool calls kept)."""
    if not isinstance(items, list):
        raise MalformedRow(f"field '{key}' is {type(items).__name__}, not a list")
    if not items:
        raise MalformedRow(f"field '{key}' is empty")
    conv = Conversation(tools=offered_tools(tools))
    n_calls = 0
    for item in items:
        if not isinstance(item, Mapping):
            raise MalformedRow(f"a turn in '{key}' is not an object")
        if "from" in item:
            role, content = fields.role(item["from"]), item.get("value")
        elif "role" in item:
            role, content = fields.role(item["role"]), item.get("content")
        else:
            raise MalformedRow(f"a turn in '{key}' has neither from/value nor role/content")
        raw_calls = item.get("tool_calls")
        if raw_calls:
            calls = calls_of(raw_calls, n_calls)
            n_calls += len(calls)
            conv.append(Turn("assistant", "" if content is None else fields.content(content), tool_calls=calls))
            continue
        if content is None:
            raise MalformedRow(f"a turn in '{key}' has no content")
        ref = item.get("tool_call_id")
        conv.append(Turn(role, fields.content(content), tool_call_id=str(ref)) if role == "tool" and ref else
                    (role, fields.content(content)))
    return _hermes(pair_tool_turns(conv))


_TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.S)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_TOOL_RESPONSE_BLOCK = re.compile(r"^\s*<tool_response>\s*(.*?)\s*</tool_response>\s*$", re.S)


def _hermes(conv: Conversation) -> Conversation:
    """Return a Hermes function-calling conversation (tools in `<tools>` of the system turn, calls in
    `<tool_call>` blocks, results in `<tool_response>`) with its structure taken out of the text;
    other conversations as they are."""
    system = next((c for r, c in conv if r == "system"), "")
    found = _TOOLS_BLOCK.search(system) if conv.tools is None else None
    if found is None:
        return conv
    out = Conversation(tools=[tool_schema(t) for t in json_values(found.group(1))])
    n_calls = 0
    for turn in conv:
        role, content = turn
        if role == "assistant" and _TOOL_CALL_BLOCK.search(content):
            blocks = _TOOL_CALL_BLOCK.findall(content)
            try:
                parsed = [json.loads(b) for b in blocks]
            except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
                raise MalformedRow("a <tool_call> block is not valid JSON") from None
            calls = calls_of(parsed, n_calls)
            n_calls += len(calls)
            turn = Turn("assistant", _TOOL_CALL_BLOCK.sub("", content).strip(), tool_calls=calls)
        elif role == "tool":
            body = _TOOL_RESPONSE_BLOCK.match(content)
            turn = Turn("tool", body.group(1) if body else content)
        out.append(turn)
    return pair_tool_turns(out)
