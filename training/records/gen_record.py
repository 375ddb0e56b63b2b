"""The generation record: one line of `curator generate`'s shard-*.jsonl, and its one malformed rule.

Written by curator (curator/generate/conversation.py), read by training (hidden states, plan). It
lives in training/ because training may not import curator; curator imports it from here.

    format     "curator-generation/1" (RECORD_FORMAT); a record without one is read as version 1,
               one of another version is malformed (written by a toolkit this one cannot read)
    id, source, category, turns, model       where the conversation came from
    messages   [{role, content, train, reasoning_content?, tool_calls?, tool_call_id?, name?}]
               assistant `tool_calls` in OpenAI shape: {id, type: "function",
               function: {name, arguments: JSON text of an object}}; a tool turn's
               `tool_call_id` names a call made earlier in the conversation.
    tools      [JSON schema of each tool the target was offered] (optional)
    tools_dropped  true when the target's chat template does not render `tools` (the prompt with them
               equals the one without): the target never saw a tool definition (optional)
    chat_template_kwargs  what the prompt was rendered with (e.g. {"enable_thinking": false})
    mode       "token": the target's own ids are stored per generation (below);
               "text":  only the text is known; training re-renders and re-tokenises it.
    mode_reason  why a record is in text mode (the engine returned no ids, ...)
    generations  (token mode) one entry per answer the target produced:
               {message: index of that answer in `messages`, prompt_ids: the exact ids the
                target was given, completion_ids: the exact ids it produced (end-of-turn
                included)}
    stop_reason  (turns: all with tools) why the conversation ends where it does, when the
               target did not follow the source trajectory ("no_tool_call", "other_tool", ...)

Every loss-masked token of a training row is a completion id of one generation, at the position
and after exactly the prompt ids that generation had.
"""

from __future__ import annotations

import json
from typing import Any

from training.io.text import is_valid_unicode

RECORD_FORMAT = "curator-generation/1"
READABLE_RECORD_FORMATS = (RECORD_FORMAT,)
ROLES = ("system", "user", "assistant", "tool")
MODES = ("token", "text")


INT64_LIMIT = 2**63  # torch.long holds ids below this


def _ids_problem(ids: Any, field: str, k: int, vocab_size: int | None) -> str | None:
    """Return what is wrong with one generation's `field` (its ids, walked once), or None.

    Stored ids are untrusted: one at or past the target's vocabulary would index past its embedding
    (an IndexError that takes down a whole capture), and one past 2^63 cannot even become a tensor
    (ValueError: Overflow). Such a record is one malformed record, counted and skipped where it
    enters (`hidden-states`, `plan`), never a crash.
    """
    if not isinstance(ids, list) or not ids:
        return f"generation for message {k} has no {field}"
    limit = min(vocab_size, INT64_LIMIT) if vocab_size else INT64_LIMIT
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool):
            return f"generation for message {k} has no {field}"
        if not 0 <= i < limit:
            where = f"the vocabulary ({vocab_size})" if vocab_size and i >= 0 else "the int64 range"
            return f"{field} holds token id {i}, outside {where}"
    return None


def tool_call_problem(call: Any) -> str | None:
    """Return what is wrong with one OpenAI-shape tool call, or None when it is well formed."""
    if not isinstance(call, dict):
        return "a tool call is not an object"
    if not isinstance(call.get("id"), str) or not call["id"]:
        return "a tool call has no id"
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        return f"tool call {call['id']!r} has no function name"
    args = fn.get("arguments")
    if not isinstance(args, str):
        return f"tool call {call['id']!r}: arguments are not a JSON string"
    try:
        parsed = json.loads(args)
    except (ValueError, RecursionError):  # bad JSON, or past json's limits
        return f"tool call {call['id']!r}: arguments are not valid JSON"
    if not isinstance(parsed, dict):
        return f"tool call {call['id']!r}: arguments are not a JSON object"
    return None


def messages_problem(messages: Any) -> str | None:
    """Return what is wrong with a message list (roles, content, tool calls and their results), or None."""
    if not isinstance(messages, list) or not messages:
        return "no messages"
    calls: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"message {i} lacks a valid role"
        content = m.get("content")
        tool_calls = m.get("tool_calls") or []
        if content is None and not tool_calls:
            return f"message {i} has no content"
        if content is not None and not isinstance(content, str):
            return f"message {i} content is not text"
        if not is_valid_unicode(content or "") or not is_valid_unicode(m.get("reasoning_content") or ""):
            return f"message {i} holds a lone surrogate (not Unicode text)"
        if tool_calls:
            if m["role"] != "assistant":
                return f"message {i} is {m['role']!r} but carries tool calls"
            if not isinstance(tool_calls, list):
                return f"message {i}: tool_calls is not a list"
            for call in tool_calls:
                problem = tool_call_problem(call)
                if problem:
                    return f"message {i}: {problem}"
                calls.add(call["id"])
        if m["role"] == "tool":
            ref = m.get("tool_call_id")
            if ref is not None and ref not in calls:
                return f"message {i} answers tool call {ref!r}, which no earlier assistant message made"
        if m.get("train") and m["role"] != "assistant":
            return f"message {i} is marked train but is {m['role']!r}"
    return None


def record_problem(record: Any, vocab_size: int | None = None) -> str | None:
    """Return why a generation record is malformed (the one rule every reader applies), or None.

    A token id negative, past 2^63 - 1 or (given `vocab_size`) at/past the target's vocabulary makes
    a token-mode record malformed.
    """
    if not isinstance(record, dict):
        return "not a JSON object"
    fmt = record.get("format", RECORD_FORMAT)
    if fmt not in READABLE_RECORD_FORMATS:
        return f"format is {fmt!r}; this toolkit reads {', '.join(READABLE_RECORD_FORMATS)} (upgrade it, or regenerate)"
    if not isinstance(record.get("id"), str) or not record["id"]:
        return "no string id"
    problem = messages_problem(record.get("messages"))
    if problem:
        return problem
    tools = record.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "tools is not a list of JSON schemas"
    kwargs = record.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        return "chat_template_kwargs is not an object"
    mode = record.get("mode", "text")
    if mode not in MODES:
        return f"mode is {mode!r}, not one of {', '.join(MODES)}"
    if mode == "token":
        return generations_problem(record, vocab_size)
    return None


def generations_problem(record: dict[str, Any], vocab_size: int | None = None) -> str | None:
    """Return what is wrong with a token-mode record's `generations` (their ids in range: `_ids_problem`), or None."""
    gens = record.get("generations")
    messages = record["messages"]
    if not isinstance(gens, list) or not gens:
        return "mode is token but there are no generations"
    seen: set[int] = set()
    for g in gens:
        if not isinstance(g, dict):
            return "a generation is not an object"
        k = g.get("message")
        if not isinstance(k, int) or not 0 <= k < len(messages) or messages[k]["role"] != "assistant":
            return f"generation for message {k!r} does not point at an assistant message"
        if k in seen:
            return f"message {k} has two generations"
        seen.add(k)
        for field in ("prompt_ids", "completion_ids"):
            problem = _ids_problem(g.get(field), field, k, vocab_size)
            if problem:
                return problem
    return None


def generation(message: int, prompt_ids: list[int], completion_ids: list[int]) -> dict[str, Any]:
    """Return one `generations` entry (the answer at messages[message], produced from prompt_ids)."""
    return {"message": message, "prompt_ids": list(prompt_ids), "completion_ids": list(completion_ids)}
