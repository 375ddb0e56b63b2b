"""The turn policy: which turns of a mix conversation the target answers, with what history,
and the output record (CONTRACTS §2) that results.

turns=all   every user turn (and the end of every run of tool turns) is answered in order; each
            request carries the target's own earlier answers as history, so the draft learns
            from conversations the target could have had.
turns=last  the given context is kept as is; only the final turn is answered.
keep_responses  the assistant messages already are the target's; nothing is requested.
Only the answers the target produced (or the kept ones) are marked train: true.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from curator.generate.client import Completion
from curator.mix.schema import MixRow, answer_points

# (history so far, endpoint of the previous turn) -> the target's answer
Ask = Callable[[Sequence[dict[str, str]], str | None], Awaitable[Completion]]


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


async def regenerate(row: MixRow, ask: Ask) -> Regenerated:
    """Return `row` with every answer the policy asks for produced by `ask`, in order; the
    given messages are kept (train: false), the produced ones are train: true."""
    if row.keep_responses:
        return Regenerated(
            messages=[{**m, "train": m["role"] == "assistant"} for m in row.messages],
        )
    points = set(answer_points(row))
    out = Regenerated(messages=[])
    endpoint: str | None = None
    for i, message in enumerate(row.messages):
        out.messages.append({**message, "train": False})
        if i not in points:
            continue
        completion = await ask(out.messages, endpoint)
        endpoint = completion.endpoint
        answer: dict[str, Any] = {"role": "assistant", "content": completion.content}
        if completion.reasoning_content:
            answer["reasoning_content"] = completion.reasoning_content
        answer["train"] = True
        out.messages.append(answer)
        out.finish_reasons.append(completion.finish_reason)
        out.prompt_tokens += completion.prompt_tokens
        out.completion_tokens += completion.completion_tokens
        out.latency_s += completion.latency_s
        out.attempts += completion.attempts
        out.endpoint = completion.endpoint
    return out


def output_record(row: MixRow, result: Regenerated, model: str) -> dict[str, Any]:
    """Return the shard line for one conversation (CONTRACTS §2; stdlib-json readable).

    finish_reason is the last answer's ("kept" for keep_responses rows); finish_reasons lists
    every answer's, so a reader can drop conversations cut off at max_tokens in any turn.
    """
    return {
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
    }
