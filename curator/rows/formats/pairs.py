"""One prompt field and one answer field: instruction/response (Magicoder), input/output
(OpenCodeInstruct), query/answer (CodeFeedback).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation
from curator.rows.formats.table import RowFormat, register


def pair(prompt_key: str, answer_key: str) -> Callable[[Mapping[str, Any]], Conversation]:
    """Return the normaliser of a row with a prompt field and an answer field."""

    def normalise(row: Mapping[str, Any]) -> Conversation:
        return Conversation([("user", fields.text(row, prompt_key)), ("assistant", fields.text(row, answer_key))])

    normalise.__doc__ = f"Return a user `{prompt_key}` and the assistant `{answer_key}`."
    return normalise


register(RowFormat("query-answer", pair("query", "answer"), columns=(frozenset({"query", "answer"}),), rank=120,
                   aliases=("codefeedback",)))
register(RowFormat("instruction-response", pair("instruction", "response"),
                   columns=(frozenset({"instruction", "response"}),), rank=140, aliases=("magicoder",)))
register(RowFormat("input-output", pair("input", "output"), columns=(frozenset({"input", "output"}),), rank=150,
                   aliases=("opencodeinstruct",)))
