"""What an engine answered a token-id generation request with, in the engines' common terms.

A wire answer that is not one is an AnswerError; the generation client (curator/generate/) decides
what it means for retries, so the engines' modules need nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard



class AnswerError(Exception):
    """An engine's answer is not one (transient) or shows the engine did not take the request (permanent)."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass
class EngineAnswer:
    """What an engine sent back: the completion ids (None: it sent only text) and its bookkeeping."""

    completion_ids: list[int] | None
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stop_token: int | None = None  # the end token the engine stopped on, when it names one


def malformed(endpoint: str, what: str) -> AnswerError:
    return AnswerError(f"malformed answer from {endpoint}: {what}", permanent=False)


def ignored_prompt(endpoint: str, detail: str) -> AnswerError:
    return AnswerError(f"{endpoint} did not take the prompt token ids as sent ({detail}); "
                        "token-exact generation needs an engine that accepts them", permanent=True)


def int_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
