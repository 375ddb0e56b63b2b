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
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from curator.errors import ConfigError


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

ALIASES = {"magicoder": "instruction-response", "opencodeinstruct": "input-output", "codefeedback": "query-answer",
           "apigen": "xlam", "hermes-function-calling": "hermes", "human-eval": "humaneval", "mt-bench": "mtbench",
           "berkeley-function-calling": "bfcl"}

# Agentic trajectories: each observation depends on the actions before it, so only the final
# answer can be regenerated faithfully.
# A request log holds each request as the target received it: its history is what the target was
# shown, so only the final turn is answered again.
DEFAULT_TURNS = {"swe-agent": "last", "glaive": "last", "deepswe": "last", "traffic": "last", "tooltalk": "last"}

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
        except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
            raise MalformedRow(f"field '{key}' is not valid JSON") from None
    return value


def _role(raw: Any) -> str:
    if not isinstance(raw, str):
        raise MalformedRow(f"role is {type(raw).__name__}, not a string")
    role = ROLE_MAP.get(raw.strip().lower())
    if role is None:
        raise MalformedRow(f"unknown role '{raw[:20]}'")
    return role


# ---------------------------------------------------------------------------- structured tools


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


def _calls(raw: Any, first_index: int) -> list[dict[str, Any]]:
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


def _tools(raw: Any) -> list[dict[str, Any]] | None:
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
    for call in _calls(list(calls), 0):
        fn = call["function"]
        blocks.append("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": json.loads(fn["arguments"])},
                                                   ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(blocks)


# ---------------------------------------------------------------------------- formats


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    # OpenAI-style content parts: keep the text parts; anything else is not a text prompt.
    if isinstance(value, list) and all(isinstance(p, Mapping) for p in value):
        if any(p.get("type", "text") != "text" or not isinstance(p.get("text"), str) for p in value):
            raise MalformedRow("non-text content part")
        return "".join(p["text"] for p in value)
    raise MalformedRow(f"content is {type(value).__name__}, not a string")


def _turns(items: Any, key: str, tools: Any = None) -> Conversation:
    """Return a conversation from a list of {from, value} or {role, content} items (OpenAI tool calls kept)."""
    if not isinstance(items, list):
        raise MalformedRow(f"field '{key}' is {type(items).__name__}, not a list")
    if not items:
        raise MalformedRow(f"field '{key}' is empty")
    conv = Conversation(tools=_tools(tools))
    n_calls = 0
    for item in items:
        if not isinstance(item, Mapping):
            raise MalformedRow(f"a turn in '{key}' is not an object")
        if "from" in item:
            role, content = _role(item["from"]), item.get("value")
        elif "role" in item:
            role, content = _role(item["role"]), item.get("content")
        else:
            raise MalformedRow(f"a turn in '{key}' has neither from/value nor role/content")
        raw_calls = item.get("tool_calls")
        if raw_calls:
            calls = _calls(raw_calls, n_calls)
            n_calls += len(calls)
            conv.append(Turn("assistant", "" if content is None else _content(content), tool_calls=calls))
            continue
        if content is None:
            raise MalformedRow(f"a turn in '{key}' has no content")
        ref = item.get("tool_call_id")
        conv.append(Turn(role, _content(content), tool_call_id=str(ref)) if role == "tool" and ref else
                    (role, _content(content)))
    return _hermes(pair_tool_turns(conv))


_TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.S)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_TOOL_RESPONSE_BLOCK = re.compile(r"^\s*<tool_response>\s*(.*?)\s*</tool_response>\s*$", re.S)


def _json_values(text: str) -> list[Any]:
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


def _hermes(conv: Conversation) -> Conversation:
    """Return a Hermes function-calling conversation (tools in `<tools>` of the system turn, calls in
    `<tool_call>` blocks, results in `<tool_response>`) with its structure taken out of the text;
    other conversations as they are."""
    system = next((c for r, c in conv if r == "system"), "")
    found = _TOOLS_BLOCK.search(system) if conv.tools is None else None
    if found is None:
        return conv
    out = Conversation(tools=[tool_schema(t) for t in _json_values(found.group(1))])
    n_calls = 0
    for turn in conv:
        role, content = turn
        if role == "assistant" and _TOOL_CALL_BLOCK.search(content):
            blocks = _TOOL_CALL_BLOCK.findall(content)
            try:
                parsed = [json.loads(b) for b in blocks]
            except (ValueError, RecursionError):  # bad JSON, or past json's limits (4,300-digit integers)
                raise MalformedRow("a <tool_call> block is not valid JSON") from None
            calls = _calls(parsed, n_calls)
            n_calls += len(calls)
            turn = Turn("assistant", _TOOL_CALL_BLOCK.sub("", content).strip(), tool_calls=calls)
        elif role == "tool":
            body = _TOOL_RESPONSE_BLOCK.match(content)
            turn = Turn("tool", body.group(1) if body else content)
        out.append(turn)
    return pair_tool_turns(out)


def sharegpt(row: Mapping[str, Any]) -> Conversation:
    """Return the turns of `conversations` ({from, value}; human/gpt/chatgpt/bing/bard/system; Hermes tool blocks parsed)."""
    return _turns(_field(row, "conversations"), "conversations", row.get("tools"))


def messages(row: Mapping[str, Any]) -> Conversation:
    """Return the turns of `messages` ({role, content}; OpenAI tool_calls, tool_call_id and `tools` kept)."""
    return _turns(_field(row, "messages"), "messages", row.get("tools"))


def openthoughts(row: Mapping[str, Any]) -> Conversation:
    """Return `system` plus the ShareGPT `conversations`."""
    system = row.get("system")
    if system is not None and not isinstance(system, str):
        raise MalformedRow("field 'system' is not a string")
    conv = sharegpt(row)
    return Conversation(([("system", system)] if system and system.strip() else []) + conv, tools=conv.tools)


def _pair(prompt_key: str, answer_key: str) -> Callable[[Mapping[str, Any]], Conversation]:
    def normalise(row: Mapping[str, Any]) -> Conversation:
        return Conversation([("user", _text(row, prompt_key)), ("assistant", _text(row, answer_key))])

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
    return Conversation([("user", prompt), ("assistant", _text(row, "output"))])


def swe_agent(row: Mapping[str, Any]) -> Conversation:
    """Return a SWE-agent `trajectory` ({role: system/user/ai, text}); observations stay user turns.

    SWE-agent sends environment observations to the model as user messages and reads its actions
    from the text (no structured calls to keep): what the target will see when it runs the same agent.
    """
    items = _field(row, "trajectory")
    if not isinstance(items, list) or not items:
        raise MalformedRow("field 'trajectory' is not a non-empty list")
    conv = Conversation()
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


_FUNCTION_BLOCK = re.compile(r"<function=([\w.\-]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([\w.\-]+)>(.*?)</parameter>", re.S)


def deepswe(row: Mapping[str, Any]) -> Conversation:
    """Return a DeepSWE/R2E-style `messages` trajectory with its `<function=NAME><parameter=K>V</parameter>
    </function>` actions as tool calls and the observation after each action as that call's tool turn;
    the tools offered are the functions the trajectory calls (string parameters)."""
    base = _turns(_field(row, "messages"), "messages")
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
    system = _text(row, "system").strip()
    if system.startswith("SYSTEM:"):
        system = system[len("SYSTEM:"):].strip()
    chat = _text(row, "chat")
    parts = _GLAIVE_MARK.split(chat)
    if len(parts) < 3:
        raise MalformedRow("field 'chat' has no USER:/ASSISTANT: parts")
    if parts[0].strip():
        raise MalformedRow("field 'chat' has text before its first USER:/ASSISTANT: mark")
    tools = None
    marker = system.find(" -\n")
    if marker >= 0 and "{" in system[marker:]:
        tools = [tool_schema(t) for t in _json_values(system[marker:])]
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


def xlam(row: Mapping[str, Any]) -> Conversation:
    """Return the user `query` with the JSON `tools` offered and the `answers` as the assistant's tool calls."""
    query = _text(row, "query")
    tools = _json_field(row, "tools")
    answers = _json_field(row, "answers")
    if not isinstance(tools, list) or not isinstance(answers, list):
        raise MalformedRow("fields 'tools'/'answers' are not JSON lists")
    return Conversation([("user", query), Turn("assistant", "", tool_calls=_calls(answers, 0))],
                        tools=[tool_schema(t) for t in tools])


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
    return messages({**request, "messages": _request_messages(_field(request, "messages"))})


# ---------------------------------------------------------------------------- benchmark packages
# The prompt files of evaluation packages on PyPI (docs/mix.md names each file): prompts only, the
# answers are the target's own.


def bfcl(row: Mapping[str, Any]) -> Conversation:
    """Return a Berkeley Function-Calling Leaderboard row: `question` (a list of turns, each a list of
    {role, content}) with the `function` list as the tools offered (`dict` schemas read as `object`).

    Multi-turn rows name their tools by class (`involved_classes`, documented in another file of the
    package) instead of listing them: they are malformed here, not answered without their tools.
    """
    if "function" not in row:
        raise MalformedRow("BFCL row without a `function` list (its tools are named by class, not given)")
    functions = row["function"]
    if not isinstance(functions, list):
        raise MalformedRow("field 'function' is not a list")
    question = _field(row, "question")
    if not isinstance(question, list) or not question:
        raise MalformedRow("field 'question' is not a non-empty list")
    items: list[Any] = []
    for group in question:
        items.extend(group if isinstance(group, list) else [group])
    conv = _turns(items, "question")
    return Conversation(conv, tools=[tool_schema(f) for f in functions] or None)


HUMANEVAL_REQUEST = "Complete the following Python function.\n\n```python\n{stub}```"


def humaneval(row: Mapping[str, Any]) -> Conversation:
    """Return a HumanEval task as a user's request: its `prompt` (a function signature and docstring)
    in a code block after one line asking to complete it, as a coding assistant is asked.

    The stub alone is a completion prompt, not a chat turn: an instruction model answers a bare stub
    with a mix of guesses, while users of a coding assistant paste code and say what they want.
    """
    stub = _text(row, "prompt")
    if not stub.strip():
        raise MalformedRow("field 'prompt' is empty")
    return Conversation([("user", HUMANEVAL_REQUEST.format(stub=stub if stub.endswith("\n") else stub + "\n"))])


def mtbench(row: Mapping[str, Any]) -> Conversation:
    """Return an MT-Bench question: its `turns` as user turns, answered one after the other (turns=all),
    the second after the target's own first answer."""
    turns = _field(row, "turns")
    if not isinstance(turns, list) or not turns:
        raise MalformedRow("field 'turns' is not a non-empty list")
    if not all(isinstance(t, str) and t.strip() for t in turns):
        raise MalformedRow("a turn in 'turns' is not a non-empty string")
    return Conversation([("user", t) for t in turns])


def ifbench(row: Mapping[str, Any]) -> Conversation:
    """Return an IFBench prompt (its `prompt`, with the instructions to follow written into it) as a user turn."""
    prompt = _text(row, "prompt")
    if not prompt.strip():
        raise MalformedRow("field 'prompt' is empty")
    return Conversation([("user", prompt)])


# ToolTalk's executor passes the session token itself (it is in no API's parameters); its recorded
# calls carry it, so it is taken out of them to match the schemas offered.
_TOOLTALK_INJECTED = "session_token"


def tooltalk(row: Mapping[str, Any]) -> Conversation:
    """Return a ToolTalk conversation: user and assistant turns (`text`), an assistant turn's `apis` as
    its tool calls followed by their results (`{"response", "exception"}` as ToolTalk shows them), and
    the schemas of the APIs of `suites_used` as the tools offered (`tools`, added by the reader from
    the package's API classes; `tools_error` when they do not convert). The closing user turn, which
    ToolTalk never answers, is left out."""
    if isinstance(row.get("tools_error"), str):
        raise MalformedRow(row["tools_error"])
    if not isinstance(row.get("tools"), list):
        raise MalformedRow("ToolTalk conversation without its tool schemas (read it in the package's own "
                           "layout, with tooltalk/apis/ beside tooltalk/data/)")
    items = _field(row, "conversation")
    if not isinstance(items, list) or not items:
        raise MalformedRow("field 'conversation' is not a non-empty list")
    conv = Conversation(tools=[tool_schema(t) for t in row["tools"]])
    n_calls = 0
    for item in items:
        if not isinstance(item, Mapping):
            raise MalformedRow("a turn in 'conversation' is not an object")
        role, text = _role(item.get("role")), item.get("text")
        if not isinstance(text, str):
            raise MalformedRow("a turn in 'conversation' has no text")
        apis = item.get("apis") or []
        if role == "assistant" and apis:
            if not isinstance(apis, list) or not all(isinstance(a, Mapping) and isinstance(a.get("request"), Mapping)
                                                     for a in apis):
                raise MalformedRow("field 'apis' is not a list of {request, response, exception}")
            calls = []
            for api in apis:
                params = api["request"].get("parameters")
                if isinstance(params, Mapping):
                    params = {k: v for k, v in params.items() if k != _TOOLTALK_INJECTED}
                calls.append(tool_call(api["request"].get("api_name"), params, f"call_{n_calls}"))
                n_calls += 1
            conv.append(Turn("assistant", "", tool_calls=calls))
            for call, api in zip(calls, apis):
                result = json.dumps({"response": api.get("response"), "exception": api.get("exception")},
                                    ensure_ascii=False)
                conv.append(Turn("tool", result, tool_call_id=call["id"]))
        conv.append((role, text))
    if len(conv) > 1 and conv[-1][0] == "user":
        # ToolTalk ends each conversation on a user turn that is never answered ("Thanks, that's all"):
        # without it the turn answered (turns=last) is the assistant's after its last calls and results.
        conv.pop()
    return pair_tool_turns(conv)


NORMALISERS: dict[str, Callable[[Mapping[str, Any]], Conversation]] = {
    "sharegpt": sharegpt,
    "hermes": sharegpt,
    "messages": messages,
    "openthoughts": openthoughts,
    "instruction-response": _pair("instruction", "response"),
    "input-output": _pair("input", "output"),
    "query-answer": _pair("query", "answer"),
    "alpaca": alpaca,
    "swe-agent": swe_agent,
    "deepswe": deepswe,
    "glaive": glaive,
    "xlam": xlam,
    "traffic": traffic,
    "bfcl": bfcl,
    "humaneval": humaneval,
    "mtbench": mtbench,
    "ifbench": ifbench,
    "tooltalk": tooltalk,
}

# Checked in order: the first whose columns are all present wins, so the more specific
# column sets come first (OpenThoughts before plain ShareGPT, alpaca before pairs).
_DETECT: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"question", "function"}), "bfcl"),
    (frozenset({"question", "involved_classes"}), "bfcl"),
    (frozenset({"task_id", "prompt", "entry_point"}), "humaneval"),
    (frozenset({"question_id", "category", "turns"}), "mtbench"),
    (frozenset({"prompt", "instruction_id_list"}), "ifbench"),
    (frozenset({"conversation", "apis_used", "suites_used"}), "tooltalk"),
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
