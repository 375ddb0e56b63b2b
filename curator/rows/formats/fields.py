"""A row's fields as every format reads them: required fields, text, JSON, roles, content parts, and
the row's own id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from curator.rows.formats.conversation import MalformedRow


ROLE_MAP = {
    "system": "system",
    "developer": "system",  # OpenAI's newer clients send system instructions so; the engines treat it as system
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}


# A source's own row id, kept beside the mix id (`source_id`) so that a row can be traced back.
ID_FIELDS = ("id", "_id", "uuid", "conversation_id", "request_id", "sample_id", "instance_id", "question_id",
             "task_id", "idx")
_MAX_ID_CHARS = 200
_ID_SET = frozenset(ID_FIELDS)


def source_id(row: Mapping[str, Any]) -> str | None:
    """Return the row's own id (the first of ID_FIELDS that holds a string or an integer), or None."""
    present = _ID_SET.intersection(row.keys())
    for key in ID_FIELDS if len(present) > 1 else present:
        value = row.get(key)
        if isinstance(value, str) and value:
            return value[:_MAX_ID_CHARS]
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def required(row: Mapping[str, Any], key: str) -> Any:
    """Return the field `key` of `row`; MalformedRow when it is missing or null."""
    if key not in row or row[key] is None:
        raise MalformedRow(f"missing field '{key}'")
    return row[key]


def text(row: Mapping[str, Any], key: str) -> str:
    """Return the string field `key` of `row` (MalformedRow: missing, or not a string)."""
    value = required(row, key)
    if not isinstance(value, str):
        raise MalformedRow(f"field '{key}' is {type(value).__name__}, not a string")
    return value


def json_value(row: Mapping[str, Any], key: str) -> Any:
    """Return the field `key` of `row`, parsed when it is JSON text."""
    value = required(row, key)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
            raise MalformedRow(f"field '{key}' is not valid JSON") from None
    return value


def role(raw: Any) -> str:
    """Return the role a source's role name stands for (ROLE_MAP), or MalformedRow."""
    if not isinstance(raw, str):
        raise MalformedRow(f"role is {type(raw).__name__}, not a string")
    role = ROLE_MAP.get(raw.strip().lower())
    if role is None:
        raise MalformedRow(f"unknown role '{raw[:20]}'")
    return role


def content(value: Any) -> str:
    """Return a turn's content as text: a string, or the text of OpenAI-style content parts."""
    if isinstance(value, str):
        return value
    # OpenAI-style content parts: keep the text parts; anything else is not a text prompt.
    if isinstance(value, list) and all(isinstance(p, Mapping) for p in value):
        if any(p.get("type", "text") != "text" or not isinstance(p.get("text"), str) for p in value):
            raise MalformedRow("non-text content part")
        return "".join(p["text"] for p in value)
    raise MalformedRow(f"content is {type(value).__name__}, not a string")
