"""HumanEval tasks.

The prompt files of evaluation packages on PyPI (docs/mix.md names each file): prompts only, the
answers are the target's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.table import RowFormat, register


HUMANEVAL_REQUEST = "Complete the following Python function.\n\n```python\n{stub}```"


def humaneval(row: Mapping[str, Any]) -> Conversation:
    """Return a HumanEval task as a user's request: its `prompt` (a function signature and docstring)
    in a code block after one line asking to complete it, as a coding assistant is asked.

    The stub alone is a completion prompt, not a chat turn: an instruction model answers a bare stub
    with a mix of guesses, while users of a coding assistant paste code and say what they want.
    """
    stub = fields.text(row, "prompt")
    if not stub.strip():
        raise MalformedRow("field 'prompt' is empty")
    return Conversation([("user", HUMANEVAL_REQUEST.format(stub=stub if stub.endswith("\n") else stub + "\n"))])


register(RowFormat("humaneval", humaneval, columns=(frozenset({"task_id", "prompt", "entry_point"}),), rank=20,
                   aliases=("human-eval",)))
