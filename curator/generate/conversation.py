"""The turn policy: which turns of a mix conversation the target answers, with what history,
and the output record (training/records/gen_record.py) that results.

turns=all   every user turn (and the end of every run of tool turns) is answered in order; each
            request carries the target's own earlier answers as history, so the draft learns
            from conversations the target could have had. Tool results come from the source
            trajectory, paired with the target's own calls by position (and function name, where
            the source names it); where the target calls no tool, another tool or a different
            number of tools than the source answered, the conversation ends at that answer and
            the record's `stop_reason` says why.
turns=last  the given context is kept as is; only the final turn is answered.
keep_responses  the assistant messages already are the target's; nothing is requested.
Only the answers the target produced (or the kept ones) are marked train: true. In token mode each
answer's prompt ids and completion ids are kept (`generations`); one answer in text mode (an
engine that returned no ids) puts the whole record in text mode, with the reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from curator.generate.client import Completion
from curator.rows.schema import MixRow, answer_points
from training.records.gen_record import RECORD_FORMAT, generation

# (history so far, endpoint of the previous turn, tools offered) -> the target's answer
Ask = Callable[[Sequence[dict[str, Any]], str | None, list[dict[str, Any]] | None], Awaitable[Completion]]


@dataclass
class Regenerated:
    """A conversation with the target's answers in place, and what producing them cost."""

    messages: list[dict[str, Any]]
    finish_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    endpoint: str | None = None
    latency_s: float = 0.0
    attempts: int = 0
    generations: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "token"
    mode_reason: str | None = None
    stop_reason: str | None = None


async def regenerate(row: MixRow, ask: Ask) -> Regenerated:
    """Return `row` with every answer the policy asks for produced by `ask`, in order; the
    given messages are kept (train: false), the produced ones are train: true."""
    if row.keep_responses:
        return Regenerated(
            messages=[{**m, "train": m["role"] == "assistant"} for m in row.messages],
            mode="text", mode_reason="kept responses",
        )
    points = set(answer_points(row))
    out = Regenerated(messages=[])
    endpoint: str | None = None
    last_calls: list[dict[str, Any]] | None = None  # the target's calls awaiting the source's results
    results_seen = 0
    # Pairing needs structure: tool turns that name their call (text-fallback sources have none and
    # their results follow the target's answers as they are).
    paired = row.turns == "all" and any(m["role"] == "tool" and m.get("tool_call_id") for m in row.messages)
    for i, message in enumerate(row.messages):
        if message["role"] == "tool" and paired and out.finish_reasons:
            stop = _pair_result(message, last_calls, results_seen)
            if stop is not None:
                out.stop_reason = stop
                break
            message = {**message, "tool_call_id": last_calls[results_seen]["id"]}  # type: ignore[index]
            results_seen += 1
        elif message["role"] != "tool" and last_calls and paired:
            out.stop_reason = "tool_call_not_in_source"  # the target called a tool the source never ran
            break
        out.messages.append({**message, "train": False})
        if i not in points:
            continue
        if last_calls and results_seen != len(last_calls):
            out.stop_reason = "tool_call_count"  # the source answered fewer calls than the target made
            break
        completion = await ask(out.messages, endpoint, row.tools)
        endpoint = completion.endpoint
        _add_answer(out, completion)
        last_calls, results_seen = completion.tool_calls, 0
    if out.stop_reason is not None:
        # The conversation ends at the target's last answer: source turns after it are not its context.
        last_answer = max(k for k, m in enumerate(out.messages) if m.get("train"))
        del out.messages[last_answer + 1:]
    if out.mode == "token" and not out.generations:
        out.mode = "text"
    return out


def _pair_result(message: dict[str, Any], calls: list[dict[str, Any]] | None, seen: int) -> str | None:
    """Return why the source's tool result cannot follow the target's answer, or None when it pairs
    with the target's call at the same position (and names the same function, where it names one)."""
    if not calls:
        return "no_tool_call"
    if seen >= len(calls):
        return "tool_call_count"
    name = message.get("name")
    if name is not None and name != calls[seen]["function"]["name"]:
        return "other_tool"
    return None


def _add_answer(out: Regenerated, completion: Completion) -> None:
    answer: dict[str, Any] = {"role": "assistant", "content": completion.content}
    if completion.reasoning_content:
        answer["reasoning_content"] = completion.reasoning_content
    if completion.tool_calls:
        answer["tool_calls"] = completion.tool_calls
    answer["train"] = True
    out.messages.append(answer)
    if completion.mode == "token" and completion.prompt_ids and completion.completion_ids:
        out.generations.append(generation(len(out.messages) - 1, completion.prompt_ids, completion.completion_ids))
    elif out.mode == "token":
        out.mode, out.mode_reason = "text", completion.mode_reason or "the backend returned no token ids"
    out.finish_reasons.append(completion.finish_reason)
    out.prompt_tokens += completion.prompt_tokens
    out.completion_tokens += completion.completion_tokens
    out.latency_s += completion.latency_s
    out.attempts += completion.attempts
    out.endpoint = completion.endpoint


def output_record(row: MixRow, result: Regenerated, model: str,
                  chat_template_kwargs: dict[str, Any] | None = None, *, tools_dropped: bool = False) -> dict[str, Any]:
    """Return the shard line for one conversation (training/records/gen_record.py; stdlib-json readable).

    finish_reason is the last answer's ("kept" for keep_responses rows); finish_reasons lists
    every answer's, so a reader can drop conversations cut off at max_tokens in any turn.
    `tools_dropped`: the row offers tools the target's chat template does not render (the prompt
    the target saw holds no tool definition); the record says so beside `tools`.
    """
    return {
        "format": RECORD_FORMAT,
        "id": row.id,
        "source": row.source,
        "category": row.category,
        "turns": row.turns,
        "model": model,
        "messages": result.messages,
        "finish_reason": result.finish_reasons[-1] if result.finish_reasons else "kept",
        "finish_reasons": result.finish_reasons,
        "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens},
        "endpoint": result.endpoint,
        "latency_s": round(result.latency_s, 4),
        "requests": len(result.finish_reasons),
        "keep_responses": row.keep_responses,
        **({"tools": row.tools} if row.tools else {}),
        **({"tools_dropped": True} if row.tools and tools_dropped else {}),
        **({"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else {}),
        "mode": result.mode,
        **({"mode_reason": result.mode_reason} if result.mode == "text" and result.mode_reason else {}),
        **({"generations": result.generations} if result.mode == "token" else {}),
        **({"stop_reason": result.stop_reason} if result.stop_reason else {}),
    }
