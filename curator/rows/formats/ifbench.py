"""IFBench prompts.

The prompt files of evaluation packages on PyPI (docs/mix.md names each file): prompts only, the
answers are the target's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.table import RowFormat, register


def ifbench(row: Mapping[str, Any]) -> Conversation:
    """Return an IFBench prompt (its `prompt`, with the instructions to follow written into it) as a user turn."""
    prompt = fields.text(row, "prompt")
    if not prompt.strip():
        raise MalformedRow("field 'prompt' is empty")
    return Conversation([("user", prompt)])


register(RowFormat("ifbench", ifbench, columns=(frozenset({"prompt", "instruction_id_list"}),), rank=40))
