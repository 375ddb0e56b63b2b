"""Structured tools as the formats that have them share them: tool calls and tool schemas in OpenAI
shape, tool turns paired with their calls, and the text fallback for sources without structure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from curator.rows.formats.conversation import Conversation, MalformedRow, Turn


def tool_call(name: Any, arguments: Any, call_id: Any) -> dict[str, Any]:
    """Return one tool call in OpenAI shape; MalformedRow when the name is missing or the arguments
    are not a JSON object (a call the target could not have made)."""
    if not isinstance(name, str) or not name:
        raise MalformedRow("tool call without a name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
            raise MalformedRow("tool call arguments are not JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise MalformedRow("tool call arguments are not a JSON object")
    return {"id": str(call_id), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def calls_of(raw: Any, first_index: int) -> list[dict[str, Any]]:
    """Return OpenAI-shape calls from a list of {id?, function: {name, arguments}} or {name, arguments}."""
    if not isinstance(raw, list):
        raise MalformedRow("tool_calls is not a list")
    out = []
    for i, call in enumerate(raw):
        if not isinstance(call, Mapping):
            raise MalformedRow("tool call is not an object")
        fn: Mapping[str, Any] = call["function"] if isinstance(call.get("function"), Mapping) else call
        args = fn.get("arguments", fn.get("parameters"))
        out.append(tool_call(fn.get("name"), args, call.get("id") or f"call_{first_index + i}"))
    return out


def tool_schema(spec: Any) -> dict[str, Any]:
    """Return a tool in OpenAI shape ({type: function, function: {name, description, parameters}}) from
    either that shape or a bare {name, description, parameters} (xlam's parameters map becomes properties)."""
    if not isinstance(spec, Mapping):
        raise MalformedRow("a tool is not an object")
    fn: Mapping[str, Any] = spec["function"] if isinstance(spec.get("function"), Mapping) else spec
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedRow("a tool has no name")
    params = fn.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise MalformedRow(f"tool {name!r} parameters are not an object")
    if params and _is_schema(params):
        # Kept as the source wrote it; only BFCL's (and Gorilla's) Python-flavoured `dict` becomes
        # JSON schema's `object`, at every level, so that templates and validators read it.
        params = _dict_as_object(params)
    elif params and _is_xlam_map(params):
        # xlam/APIGen list parameters as {arg: {type, description, default}}: make it a JSON schema.
        params = {"type": "object", "properties": dict(params)}
    elif params:
        raise MalformedRow(f"tool {name!r} parameters are neither a JSON schema nor a map of arguments")
    out: dict[str, Any] = {"name": name}
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    out["parameters"] = dict(params) or {"type": "object", "properties": {}}
    return {"type": "function", "function": out}


def _is_schema(params: Mapping[str, Any]) -> bool:
    """Return whether tool parameters are a JSON schema: a `type` keyword that is a name (not an argument
    called "type"), or `properties` that map names to schemas."""
    return isinstance(params.get("type"), str) or (
        isinstance(params.get("properties"), Mapping) and "type" not in params)


def _is_xlam_map(params: Mapping[str, Any]) -> bool:
    """Return whether tool parameters are xlam's {arg: {type, description, ...}} map (every value one argument)."""
    return all(isinstance(v, Mapping) and ("type" in v or "description" in v) for v in params.values())


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_ONES = ("items", "additionalProperties", "not", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _dict_as_object(schema: Any, depth: int = 0) -> Any:
    """Return `schema` with every `"type": "dict"` written `"object"`; everything else as it was."""
    if not isinstance(schema, Mapping) or depth > 64:  # deeper than any real tool: left as written
        return schema
    out = dict(schema)
    if out.get("type") == "dict":
        out["type"] = "object"
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: _dict_as_object(v, depth + 1) for k, v in out[key].items()}
    for key in _SUBSCHEMA_ONES:
        if isinstance(out.get(key), Mapping):
            out[key] = _dict_as_object(out[key], depth + 1)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_dict_as_object(v, depth + 1) for v in out[key]]
    return out


def offered_tools(raw: Any) -> list[dict[str, Any]] | None:
    """Return the tools a row offers (a list, or its JSON text) in OpenAI shape, or None."""
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else None
        except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
            raise MalformedRow("field 'tools' is not valid JSON") from None
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise MalformedRow("field 'tools' is not a list")
    return [tool_schema(t) for t in raw] or None


def pair_tool_turns(conv: Conversation) -> Conversation:
    """Return `conv` with every tool turn tied to the call it answers (tool_call_id and name): by its
    id where it has one, else the oldest unanswered call; MalformedRow for a tool turn that answers
    no call. Conversations without structured calls are returned as they are."""
    if not any(getattr(t, "tool_calls", None) for t in conv):
        return conv
    open_calls: dict[str, str] = {}  # id -> function name, in call order
    out = Conversation(tools=conv.tools)
    for turn in conv:
        role, content = turn
        if role == "assistant" and getattr(turn, "tool_calls", None):
            open_calls.update({c["id"]: c["function"]["name"] for c in turn.tool_calls})
        elif role == "tool":
            ref = getattr(turn, "tool_call_id", None)
            if ref is None:
                if not open_calls:
                    raise MalformedRow("a tool turn answers no tool call")
                ref = next(iter(open_calls))
            elif ref not in open_calls:
                raise MalformedRow(f"a tool turn answers call {str(ref)[:40]!r}, which was not made")
            turn = Turn("tool", content, tool_call_id=ref, name=open_calls.pop(ref))
        out.append(turn)
    return out


def render_tool_calls(calls: Iterable[Any]) -> str:
    """Return tool calls as text (the fallback for sources without structure): one `<tool_call>{json}</tool_call>` block per call."""
    blocks = []
    for call in calls_of(list(calls), 0):
        fn = call["function"]
        blocks.append("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": json.loads(fn["arguments"])},
                                                   ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(blocks)


def json_values(text: str) -> list[Any]:
    """Return the JSON values written one after another in `text` (a list's items when it is one list)."""
    decoder, i = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while i < len(text) and text[i] not in "[{":
            i += 1
        if i >= len(text):
            return values[0] if len(values) == 1 and isinstance(values[0], list) else values
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
            raise MalformedRow("a tool definition is not valid JSON") from None
        values.append(value)
