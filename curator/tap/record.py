"""One exchange through the tap turned into a tap record (v1, docs/tap.md).

Everything here runs on the writer's thread, never on the request path: the proxy hands over the
request's bytes and the engine's answer bytes as they went by, and this module parses them (one
JSON body, or an SSE stream of chunks), scrubs every text the user or the target wrote, and
returns the record. No header is ever read here: the proxy passes none, so credentials
(Authorization, api keys, cookies) cannot reach a record.

Token ids are kept only where the text they encode was not changed by the scrubber: ids of a
prompt whose e-mail address was scrubbed would spell the address back out.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

KIND = "curator.tap"
VERSION = 1
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
             "/chat/completions": "chat", "/completions": "completions"}
# request fields the record holds on its own (or never: `user` names a person by definition)
_OWN_FIELDS = ("messages", "prompt", "tools", "stream", "user")


@dataclass
class Exchange:
    """What the proxy saw of one sampled request: the request body, the engine's status, the
    answer's bytes as forwarded, whether it was streamed, and whether the client got all of it."""

    endpoint: str  # "chat" or "completions"
    request: bytes
    status: int = 0
    chunks: list[bytes] = field(default_factory=list)
    streamed: bool = False
    delivered: bool = True  # False: the client went away before the answer ended
    submitted: bool = False  # handed to the writer (the proxy's flag: each exchange is handed over once)
    time: float = 0.0  # UNIX seconds at the request's arrival


class Unreadable(ValueError):
    """The request is not a JSON object the tap can record (counted, never fatal)."""


def _scrub_content(content: Any, scrub: Callable[[str], str]) -> Any:
    if isinstance(content, str):
        return scrub(content)
    if isinstance(content, list):  # OpenAI content parts: text parts scrubbed, others (images) kept as sent
        return [{**part, "text": scrub(part["text"])} if isinstance(part, dict) and isinstance(part.get("text"), str) else part
                for part in content]
    return content


def _scrub_tool_calls(calls: Any, scrub: Callable[[str], str]) -> Any:
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            call = {**call, "function": {**fn, "arguments": scrub(fn["arguments"])}}
        out.append(call)
    return out


def scrub_message(message: Any, scrub: Callable[[str], str]) -> Any:
    """Return one OpenAI message with its content, reasoning and tool-call arguments scrubbed."""
    if not isinstance(message, dict):
        return message
    out = dict(message)
    for key in ("content", "reasoning_content", "reasoning"):
        if key in out:
            out[key] = _scrub_content(out[key], scrub)
    if "tool_calls" in out:
        out["tool_calls"] = _scrub_tool_calls(out["tool_calls"], scrub)
    return out


def _scrub_value(value: Any, scrub: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrub_value(v, scrub) for v in value]
    if isinstance(value, dict):
        return {k: _scrub_value(v, scrub) for k, v in value.items()}
    return value


def parse_request(body: bytes) -> dict[str, Any]:
    """Return the request's JSON object, or raise Unreadable."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        raise Unreadable("request body is not JSON") from None
    if not isinstance(request, dict):
        raise Unreadable("request body is not a JSON object")
    return request


@dataclass
class _Answer:
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None
    reasoning_key: str = "reasoning_content"
    tool_calls: list[dict[str, Any]] | None = None
    text: str | None = None  # completions
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    usage: dict[str, Any] | None = None


def _ids(value: Any) -> list[int] | None:
    return list(value) if isinstance(value, list) and all(isinstance(v, int) for v in value) else None


def _from_body(endpoint: str, data: dict[str, Any]) -> _Answer:
    """The answer of a non-streamed response (choice 0)."""
    ans = _Answer(usage=data.get("usage") if isinstance(data.get("usage"), dict) else None)
    choices = data.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    ans.finish_reason = choice.get("finish_reason")
    # vLLM's return_token_ids: completions put both on the choice; chat puts the prompt's at the top
    ans.prompt_token_ids = _ids(choice.get("prompt_token_ids")) or _ids(data.get("prompt_token_ids"))
    ans.completion_token_ids = _ids(choice.get("token_ids"))
    if endpoint == "chat":
        msg = choice.get("message") or {}
        ans.role = msg.get("role") or "assistant"
        ans.content = msg.get("content")
        for key in ("reasoning_content", "reasoning"):
            if msg.get(key) is not None:
                ans.reasoning, ans.reasoning_key = msg[key], key
                break
        ans.tool_calls = msg.get("tool_calls") or None
    else:
        ans.text = choice.get("text")
    return ans


def _sse_events(chunks: Sequence[bytes]) -> tuple[list[dict[str, Any]], bool]:
    """The JSON events of an SSE stream and whether it ended with `data: [DONE]`. A torn last event
    (the client left mid-line) is not an event."""
    events: list[dict[str, Any]] = []
    done = False
    text = b"".join(chunks).replace(b"\r\n", b"\n")
    for block in text.split(b"\n\n"):
        data = b"\n".join(line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:"))
        if not data:
            continue
        if data.strip() == b"[DONE]":
            done = True
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, done


def _from_stream(endpoint: str, events: list[dict[str, Any]]) -> _Answer:
    """The answer of a streamed response, put together from its deltas (choice 0)."""
    ans = _Answer()
    content: list[str] = []
    reasoning: list[str] = []
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    completion_ids: list[int] = []
    saw_ids = False
    for event in events:
        if isinstance(event.get("usage"), dict):
            ans.usage = event["usage"]
        if ans.prompt_token_ids is None:
            ans.prompt_token_ids = _ids(event.get("prompt_token_ids"))
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if ans.prompt_token_ids is None:
                ans.prompt_token_ids = _ids(choice.get("prompt_token_ids"))
            ids = _ids(choice.get("token_ids"))
            if ids is not None:
                saw_ids = True
                completion_ids.extend(ids)
            if choice.get("finish_reason") is not None:
                ans.finish_reason = choice["finish_reason"]
            if endpoint != "chat":
                if isinstance(choice.get("text"), str):
                    text.append(choice["text"])
                continue
            delta = choice.get("delta") or {}
            if delta.get("role"):
                ans.role = delta["role"]
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    reasoning.append(delta[key])
                    ans.reasoning_key = key
                    break
            for call in delta.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                slot = calls.setdefault(int(call.get("index", len(calls))), {"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    slot["function"]["arguments"] += fn["arguments"]
    if endpoint == "chat":
        ans.content = "".join(content) if content or not calls else None
        ans.reasoning = "".join(reasoning) if reasoning else None
        ans.tool_calls = [calls[i] for i in sorted(calls)] or None
    else:
        ans.text = "".join(text)
    ans.completion_token_ids = completion_ids if saw_ids else None
    return ans


def utc_iso(seconds: float) -> str:
    """Return a UNIX time as UTC ISO-8601 with microseconds ("2026-12-05T15:04:05.123456Z")."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_record(exchange: Exchange, request: dict[str, Any], scrub: Callable[[str], str]) -> dict[str, Any]:
    """Return the tap record of one exchange whose request parsed to `request`, every text scrubbed."""
    endpoint = exchange.endpoint
    rec: dict[str, Any] = {"kind": KIND, "version": VERSION, "id": secrets.token_hex(16),
                           "time": utc_iso(exchange.time), "endpoint": endpoint, "model": request.get("model")}
    prompt_changed = False
    if endpoint == "chat":
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise Unreadable("chat request without a messages list")
        rec["messages"] = [scrub_message(m, scrub) for m in messages]
        prompt_changed = rec["messages"] != messages
    else:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            rec["prompt"] = scrub(prompt)
            prompt_changed = rec["prompt"] != prompt
        # a prompt of token ids is not text: it stays out, the engine's prompt_token_ids below hold it
    if request.get("tools") is not None:
        rec["tools"] = request["tools"]
    rec["params"] = {k: _scrub_value(v, scrub) for k, v in request.items() if k not in _OWN_FIELDS and k != "model"}
    rec["stream"] = exchange.streamed
    rec["status"] = exchange.status
    complete = exchange.delivered
    ans: _Answer | None = None
    if exchange.status == 200:
        if exchange.streamed:
            events, done = _sse_events(exchange.chunks)
            ans = _from_stream(endpoint, events)
            complete = complete and ans.finish_reason is not None
            del done  # a stream with a finish_reason is whole even when [DONE] never came
        else:
            try:
                data = json.loads(b"".join(exchange.chunks))
            except ValueError:
                data = None
            if isinstance(data, dict):
                ans = _from_body(endpoint, data)
            else:
                complete = False  # the client left before the body was whole (or the engine sent no JSON)
    answer_changed = False
    if ans is not None:
        if endpoint == "chat":
            answer: dict[str, Any] = {"role": ans.role, "content": ans.content}
            if ans.reasoning is not None:
                answer[ans.reasoning_key] = ans.reasoning
            if ans.tool_calls:
                answer["tool_calls"] = ans.tool_calls
            scrubbed = scrub_message(answer, scrub)
        else:
            answer = {"text": ans.text}
            scrubbed = {"text": scrub(ans.text) if isinstance(ans.text, str) else ans.text}
        answer_changed = scrubbed != answer
        rec["answer"] = scrubbed
    rec["finish_reason"] = ans.finish_reason if ans is not None else None
    rec["complete"] = complete
    if ans is not None:
        if ans.prompt_token_ids is not None and not prompt_changed:
            rec["prompt_token_ids"] = ans.prompt_token_ids
        if ans.completion_token_ids is not None and not answer_changed:
            rec["completion_token_ids"] = ans.completion_token_ids
        if ans.usage is not None:
            rec["usage"] = ans.usage
    return rec


def classify_input(endpoint: str, request: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """Return the (messages, tools) the traffic classifier reads for a request (a completions prompt is one user turn)."""
    if endpoint == "chat":
        messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    else:
        prompt = request.get("prompt")
        messages = [{"role": "user", "content": prompt if isinstance(prompt, str) else ""}]
    tools = request.get("tools")
    return messages, tools if isinstance(tools, list) else None
