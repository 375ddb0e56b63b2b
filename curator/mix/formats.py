"""Row formats: each normaliser turns one dataset row into a conversation of (role, content).

Roles out are system, user, assistant, tool. A row that does not fit its format raises
MalformedRow with a short reason (counted per source, never fatal). Tool calls are rendered
into the assistant's text and tool results become `tool` turns, so nothing is lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from curator.errors import ConfigError

Message = tuple[str, str]
Conversation = list[Message]


class MalformedRow(Exception):
    """A row that does not fit its source's format; the message is the (short) reason."""


ROLE_MAP = {
    "system": "system",
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

ALIASES = {"magicoder": "instruction-response", "opencodeinstruct": "input-output", "codefeedback": "query-answer"}

# Agentic trajectories: each observation depends on the actions before it, so only the final
# answer can be regenerated faithfully.
DEFAULT_TURNS = {"swe-agent": "last", "glaive": "last"}


def _field(row: Mapping[str, Any], key: str) -> Any:
    if key not in row or row[key] is None:
        raise MalformedRow(f"missing field '{key}'")
    return row[key]


def _text(row: Mapping[str, Any], key: str) -> str:
    value = _field(row, key)
    if not isinstance(value, str):
        raise MalformedRow(f"field '{key}' is {type(value).__name__}, not a string")
    return value


def _json_field(row: Mapping[str, Any], key: str) -> Any:
    value = _field(row, key)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise MalformedRow(f"field '{key}' is not valid JSON") from None
    return value


def _role(raw: Any) -> str:
    if not isinstance(raw, str):
        raise MalformedRow(f"role is {type(raw).__name__}, not a string")
    role = ROLE_MAP.get(raw.strip().lower())
    if role is None:
        raise MalformedRow(f"unknown role '{raw[:20]}'")
    return role


def render_tool_calls(calls: Iterable[Any]) -> str:
    """Return tool calls as text: one `<tool_call>{json}</tool_call>` block per call."""
    blocks = []
    for call in calls:
        if not isinstance(call, Mapping):
            raise MalformedRow("tool call is not an object")
        fn = call.get("function") if isinstance(call.get("function"), Mapping) else call
        name, args = fn.get("name"), fn.get("arguments", {})
        if not isinstance(name, str):
            raise MalformedRow("tool call without a name")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass  # keep the arguments as the model wrote them
        blocks.append("<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(blocks)


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    # OpenAI-style content parts: keep the text parts; anything else is not a text prompt.
    if isinstance(value, list) and all(isinstance(p, Mapping) for p in value):
        if any(p.get("type", "text") != "text" or not isinstance(p.get("text"), str) for p in value):
            raise MalformedRow("non-text content part")
        return "".join(p["text"] for p in value)
    raise MalformedRow(f"content is {type(value).__name__}, not a string")


def _turns(items: Any, key: str) -> Conversation:
    """Return a conversation from a list of {from, value} or {role, content} items."""
    if not isinstance(items, list):
        raise MalformedRow(f"field '{key}' is {type(items).__name__}, not a list")
    if not items:
        raise MalformedRow(f"field '{key}' is empty")
    conv: Conversation = []
    for item in items:
        if not isinstance(item, Mapping):
            raise MalformedRow(f"a turn in '{key}' is not an object")
        if "from" in item:
            role, content = _role(item["from"]), item.get("value")
        elif "role" in item:
            role, content = _role(item["role"]), item.get("content")
        else:
            raise MalformedRow(f"a turn in '{key}' has neither from/value nor role/content")
        calls = item.get("tool_calls")
        if calls:
            text = "" if content is None else _content(content)
            content = (text + "\n" if text else "") + render_tool_calls(calls)
        if content is None:
            raise MalformedRow(f"a turn in '{key}' has no content")
        conv.append((role, _content(content)))
    return conv


def sharegpt(row: Mapping[str, Any]) -> Conversation:
    """Return the turns of `conversations` ({from, value}; human/gpt/chatgpt/bing/bard/system)."""
    return _turns(_field(row, "conversations"), "conversations")


def messages(row: Mapping[str, Any]) -> Conversation:
    """Return the turns of `messages` ({role, content}, OpenAI tool_calls rendered)."""
    return _turns(_field(row, "messages"), "messages")


def openthoughts(row: Mapping[str, Any]) -> Conversation:
    """Return `system` plus the ShareGPT `conversations`."""
    system = row.get("system")
    if system is not None and not isinstance(system, str):
        raise MalformedRow("field 'system' is not a string")
    conv = sharegpt(row)
    return ([("system", system)] if system and system.strip() else []) + conv


def _pair(prompt_key: str, answer_key: str) -> Callable[[Mapping[str, Any]], Conversation]:
    def normalise(row: Mapping[str, Any]) -> Conversation:
        return [("user", _text(row, prompt_key)), ("assistant", _text(row, answer_key))]

    normalise.__doc__ = f"Return a user `{prompt_key}` and the assistant `{answer_key}`."
    return normalise


def alpaca(row: Mapping[str, Any]) -> Conversation:
    """Return the user `instruction` (+ `input` after a blank line) and the assistant `output`."""
    prompt = _text(row, "instruction")
    extra = row.get("input")
    if extra is not None and not isinstance(extra, str):
        raise MalformedRow("field 'input' is not a string")
    if extra and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    return [("user", prompt), ("assistant", _text(row, "output"))]


def swe_agent(row: Mapping[str, Any]) -> Conversation:
    """Return a SWE-agent `trajectory` ({role: system/user/ai, text}); observations stay user turns.

    SWE-agent sends environment observations to the model as user messages; keeping that is
    what the target will see when it runs the same agent.
    """
    items = _field(row, "trajectory")
    if not isinstance(items, list) or not items:
        raise MalformedRow("field 'trajectory' is not a non-empty list")
    conv: Conversation = []
    for item in items:
        if not isinstance(item, Mapping):
            raise MalformedRow("a trajectory step is not an object")
        role = _role(item.get("role"))
        text = item.get("text")
        if role == "system" and not text:
            text = item.get("system_prompt")
        if not isinstance(text, str):
            raise MalformedRow("a trajectory step has no text")
        conv.append((role, text))
    return conv


_GLAIVE_MARK = re.compile(r"(?:^|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_GLAIVE_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}


def glaive(row: Mapping[str, Any]) -> Conversation:
    """Return glaive's `system` and the USER/ASSISTANT/FUNCTION RESPONSE parts of `chat`.

    `<functioncall> {...}` stays in the assistant text (the call itself); `<|endoftext|>`
    markers are dropped.
    """
    system = _text(row, "system").strip()
    if system.startswith("SYSTEM:"):
        system = system[len("SYSTEM:"):].strip()
    chat = _text(row, "chat")
    parts = _GLAIVE_MARK.split(chat)
    if len(parts) < 3:
        raise MalformedRow("field 'chat' has no USER:/ASSISTANT: parts")
    if parts[0].strip():
        raise MalformedRow("field 'chat' has text before its first USER:/ASSISTANT: mark")
    conv: Conversation = [("system", system)] if system else []
    for mark, body in zip(parts[1::2], parts[2::2]):
        conv.append((_GLAIVE_ROLES[mark], body.replace("<|endoftext|>", "").strip()))
    return conv


def xlam(row: Mapping[str, Any]) -> Conversation:
    """Return a system turn listing the JSON `tools`, the user `query`, and the `answers` as tool calls."""
    query = _text(row, "query")
    tools = _json_field(row, "tools")
    answers = _json_field(row, "answers")
    if not isinstance(tools, list) or not isinstance(answers, list):
        raise MalformedRow("fields 'tools'/'answers' are not JSON lists")
    system = "You have access to the following tools:\n" + json.dumps(tools, ensure_ascii=False)
    return [("system", system), ("user", query), ("assistant", render_tool_calls(answers))]


NORMALISERS: dict[str, Callable[[Mapping[str, Any]], Conversation]] = {
    "sharegpt": sharegpt,
    "messages": messages,
    "openthoughts": openthoughts,
    "instruction-response": _pair("instruction", "response"),
    "input-output": _pair("input", "output"),
    "query-answer": _pair("query", "answer"),
    "alpaca": alpaca,
    "swe-agent": swe_agent,
    "glaive": glaive,
    "xlam": xlam,
}

# Checked in order: the first whose columns are all present wins, so the more specific
# column sets come first (OpenThoughts before plain ShareGPT, alpaca before pairs).
_DETECT: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"trajectory"}), "swe-agent"),
    (frozenset({"system", "conversations"}), "openthoughts"),
    (frozenset({"conversations"}), "sharegpt"),
    (frozenset({"messages"}), "messages"),
    (frozenset({"system", "chat"}), "glaive"),
    (frozenset({"query", "tools", "answers"}), "xlam"),
    (frozenset({"query", "answer"}), "query-answer"),
    (frozenset({"instruction", "input", "output"}), "alpaca"),
    (frozenset({"instruction", "output"}), "alpaca"),
    (frozenset({"instruction", "response"}), "instruction-response"),
    (frozenset({"input", "output"}), "input-output"),
)


def detect_format(columns: Iterable[str]) -> str | None:
    """Return the format whose columns a row has, or None."""
    have = set(columns)
    for needed, name in _DETECT:
        if needed <= have:
            return name
    return None


def resolve_format(requested: str, columns: Iterable[str], where: str) -> str:
    """Return the canonical format name for a source; `auto` is detected from `columns`."""
    if requested != "auto":
        return ALIASES.get(requested, requested)
    columns = list(columns)
    found = detect_format(columns)
    if found is None:
        known = ", ".join(sorted(NORMALISERS))
        raise ConfigError(
            f"{where}: format: auto found no format for columns [{', '.join(columns)}]; "
            f"set `format:` to one of {known}, or convert the data"
        )
    return found


def default_turns(fmt: str) -> str:
    """Return the turn policy a format gets when the recipe does not say."""
    return DEFAULT_TURNS.get(fmt, "all")


def to_prompt(conv: Conversation, turns: str, keep_responses: bool) -> Conversation:
    """Return the conversation the mix stores for a turn policy (see CONTRACTS §1)."""
    if not any(role == "user" for role, _ in conv):
        raise MalformedRow("no user turn")
    if keep_responses:
        if not any(role == "assistant" for role, _ in conv):
            raise MalformedRow("keep_responses but no assistant turn")
        return conv
    if turns == "all":
        return [m for m in conv if m[0] != "assistant"]
    last = max(i for i, (role, _) in enumerate(conv) if role in ("user", "tool"))
    return conv[: last + 1]
