"""Request logs (`format: traffic`): each request as an OpenAI-compatible server or a gateway logs it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation
from curator.rows.formats.messages import messages
from curator.rows.formats.table import RowFormat, register


def _text_parts(content: Any) -> Any:
    # A multimodal request is still a request: its text parts are what the draft will see as text.
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        return "".join(p["text"] for p in content if p.get("type", "text") == "text" and isinstance(p.get("text"), str))
    return content


def _request_messages(items: Any) -> Any:
    if not isinstance(items, list):
        return items
    return [{**m, "content": _text_parts(m["content"])} if isinstance(m, Mapping) and "content" in m else m
            for m in items]


def traffic(row: Mapping[str, Any]) -> Conversation:
    """Return a logged request: `{messages, tools?}` as OpenAI-compatible servers log it, or wrapped as
    request-log middlewares write it (`{"body": {...}}`, the body possibly JSON text), or a completions
    request (`{"prompt": "..."}`, one user turn). Multimodal content keeps its text parts."""
    request = unwrap_request(dict(row))
    if "messages" not in request and isinstance(request.get("prompt"), str):
        return messages({"messages": [{"role": "user", "content": request["prompt"]}]})
    return messages({**request, "messages": _request_messages(fields.required(request, "messages"))})


def unwrap_request(record: dict) -> dict:
    """Return the request inside a request-log record.

    Servers log the request itself (`{"messages": [...], "tools": [...], ...}`); request-log
    middlewares and gateways wrap it (`{"body": {...}, "headers": ..., "ts": ...}`), sometimes
    with the body as a JSON string. A record that is neither is returned as it is.
    """
    body = record.get("body")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):
            return record
    if isinstance(body, dict) and "messages" in body and "messages" not in record:
        return body
    return record


# A request log holds each request as the target received it: its history is what the target was
# shown, so only the final turn is answered again.
register(RowFormat("traffic", traffic, turns="last"))
