"""The sampling settings every request to a serving engine carries besides its prompt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """What every chat request carries besides the messages."""

    temperature: float = 0.7
    top_p: float | None = None
    max_tokens: int = 4096
    extra_body: Mapping[str, Any] = field(default_factory=dict)
