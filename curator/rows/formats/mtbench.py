"""MT-Bench questions.

The prompt files of evaluation packages on PyPI (docs/mix.md names each file): prompts only, the
answers are the target's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.table import RowFormat, register


def mtbench(row: Mapping[str, Any]) -> Conversation:
    """Return an MT-Bench question: its `turns` as user turns, answered one after the other (turns=all),
    the second after the target's own first answer."""
    turns = fields.required(row, "turns")
    if not isinstance(turns, list) or not turns:
        raise MalformedRow("field 'turns' is not a non-empty list")
    if not all(isinstance(t, str) and t.strip() for t in turns):
        raise MalformedRow("a turn in 'turns' is not a non-empty string")
    return Conversation([("user", t) for t in turns])


register(RowFormat("mtbench", mtbench, columns=(frozenset({"question_id", "category", "turns"}),), rank=30,
                   aliases=("mt-bench",)))
