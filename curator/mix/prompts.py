"""The prompts a mix holds for measuring a draft: each row's first context to answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def mix_prompts(mix_dir: Path) -> tuple[list[Any], int]:
    """Return the prompts of a finished mix (each row's first context to answer) and the count of malformed rows."""
    from curator.rows.schema import BadRow, first_context, open_mix
    from training.eval.prompts import EvalPrompt

    prompts, malformed = [], 0
    for row in open_mix(mix_dir).rows():
        context = first_context(row) if not isinstance(row, BadRow) else []
        if isinstance(row, BadRow) or not context:
            malformed += 1
            continue
        prompts.append(EvalPrompt(id=row.id, messages=context, category=row.category))
    return prompts, malformed
