"""Berkeley Function-Calling Leaderboard rows.

The prompt files of evaluation packages on PyPI (docs/mix.md names each file): prompts only, the
answers are the target's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.chat import chat_turns
from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.tools import tool_schema
from curator.rows.formats.table import RowFormat, register


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
    question = fields.required(row, "question")
    if not isinstance(question, list) or not question:
        raise MalformedRow("field 'question' is not a non-empty list")
    items: list[Any] = []
    for group in question:
        items.extend(group if isinstance(group, list) else [group])
    conv = chat_turns(items, "question")
    return Conversation(conv, tools=[tool_schema(f) for f in functions] or None)


register(RowFormat("bfcl", bfcl, columns=(frozenset({"question", "function"}), frozenset({"question", "involved_classes"})),
                   rank=10, aliases=("berkeley-function-calling",)))
