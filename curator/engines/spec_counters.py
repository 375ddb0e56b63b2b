"""Speculative-decoding counters read off a server at one moment, and what a group of requests
added to them: bench-serve's engine-side acceptance for engines that count on /metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    """Drafts proposed, draft tokens, tokens accepted, and accepted per draft position."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    def minus(self, before: SpecCounters) -> SpecCounters:
        """Return what was counted since `before`."""
        return SpecCounters(
            self.drafts - before.drafts, self.draft_tokens - before.draft_tokens, self.accepted - before.accepted,
            {p: v - before.accepted_per_pos.get(p, 0.0) for p, v in self.accepted_per_pos.items()},
        )

    @property
    def acceptance_length(self) -> float:
        """Return 1 + accepted / drafts (the mean acceptance length, bonus token included)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else math.nan

    def position_rates(self) -> list[float]:
        """Return per draft position the share of drafts whose tokens 1..k were all accepted."""
        return [self.accepted_per_pos[p] / self.drafts if self.drafts else math.nan for p in sorted(self.accepted_per_pos)]
