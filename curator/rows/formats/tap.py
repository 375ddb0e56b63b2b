"""A `curator tap` log as a mix source (`format: tap`): each tapped chat exchange becomes a conversation
of the request's messages and the target's own answer.

The tap record (v1) is the contract between `curator tap`, which writes it, and its readers
(docs/tap.md): one JSON object per line of the log folder's `tap-*.jsonl` files. Its answer is the
target's own, sampled from what it served, so the mix row keeps it (keep_responses) and generate
requests nothing for it; `regenerate: true` on the source keeps only the request, for generate to
answer again. What is not a whole chat exchange is counted and skipped, with the reason: a
completions request (a prompt, not a conversation), an engine error status, an answer the client
did not get whole (it left mid-stream, or the stream ended without a finish reason).

An answer with reasoning text is skipped as well while it is kept: a mix row's messages carry no
reasoning field (curator/rows/schema.py), and an answer stored without the reasoning the target
wrote before it is a token stream the target never produced.

curator.tap sits on a floor above this package (docs/architecture.md), so the record's kind and
version are named here again, as the readers of any file format name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats.conversation import Conversation, MalformedRow, SkippedRow
from curator.rows.formats.table import RowFormat, register
from curator.rows.formats.traffic import traffic

KIND = "curator.tap"
VERSION = 1
INCOMPLETE = "incomplete answer (the client left mid-answer, or the stream ended without a finish reason)"
COMPLETIONS = "completions endpoint (a prompt, not a chat conversation)"
REASONING = "answer with reasoning, which a mix row cannot carry (regenerate: true answers it again)"


def _checked(row: Mapping[str, Any]) -> None:
    """Raise MalformedRow for what is no tap record v1, SkippedRow for a record that is no whole chat exchange."""
    if row.get("kind") != KIND:
        raise MalformedRow("not a tap record (no kind: curator.tap)")
    if row.get("version") != VERSION:
        raise MalformedRow(f"tap record version {str(row.get('version'))[:20]} (this curator reads version {VERSION})")
    endpoint = row.get("endpoint")
    if endpoint == "completions":
        raise SkippedRow(COMPLETIONS)
    if endpoint != "chat":
        raise MalformedRow(f"tap record endpoint {str(endpoint)[:20]!r} is neither chat nor completions")
    status = row.get("status")
    if status != 200:
        raise SkippedRow(f"engine status {str(status)[:20]}")
    if row.get("complete") is not True:
        raise SkippedRow(INCOMPLETE)


def _answer(row: Mapping[str, Any]) -> dict[str, Any]:
    answer = row.get("answer")
    if not isinstance(answer, Mapping):
        raise MalformedRow("tap record of status 200 without an answer")
    if answer.get("reasoning_content") or answer.get("reasoning"):
        raise SkippedRow(REASONING)
    content, calls = answer.get("content"), answer.get("tool_calls")
    if content is None and not calls:
        raise MalformedRow("tap answer has neither content nor tool calls")
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out


def _tap(row: Mapping[str, Any], keep_answer: bool) -> Conversation:
    """Return a tap record's request + its answer (`keep_answer`), else the request alone."""
    _checked(row)
    messages = row.get("messages")
    if not isinstance(messages, list):
        raise MalformedRow("tap chat record without a messages list")
    request: dict[str, Any] = {"messages": [*messages, _answer(row)] if keep_answer else messages}
    if row.get("tools") is not None:
        request["tools"] = row["tools"]
    return traffic(request)  # the request-log normaliser: roles, text parts, tool calls checked and paired


def tap_request(row: Mapping[str, Any]) -> Conversation:
    """Return a tap record's request alone (`regenerate: true`: generate answers it again)."""
    return _tap(row, False)


def tap_exchange(row: Mapping[str, Any]) -> Conversation:
    """Return a tap record's request and the target's own answer."""
    return _tap(row, True)


def request_part(prompt: Conversation) -> Conversation:
    """Return a tapped conversation without the target's answer: the request as the target got it
    (what the traffic classifier reads, as `curator profile` does, and what a held-out row asks)."""
    end = len(prompt)
    while end and prompt[end - 1][0] == "assistant":
        end -= 1
    return Conversation(prompt[:end], tools=prompt.tools)


# A tap log is served traffic: each request is answered at its last turn, as the target served it.
register(RowFormat("tap", tap_request, turns="last", answered=tap_exchange))
