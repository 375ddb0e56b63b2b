"""A capture run's counters: samples stored, skipped and why, tokens, timings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ExtractStats:
    """What an extraction run did (one rank's view, or the sum over ranks)."""

    records: int = 0
    already_done: int = 0
    other_rank: int = 0
    malformed: int = 0
    no_loss_tokens: int = 0
    truncated: int = 0
    too_long: int = 0  # longer than the target's positions (after --max-len): skipped, never run
    stored: int = 0
    nonfinite: int = 0
    failed: int = 0  # engine requests that failed for good (vLLM backend)
    tokens: int = 0
    loss_tokens: int = 0
    bytes_written: int = 0
    wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Return stored tokens per second of wall time."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def skipped(self) -> int:
        """Return the samples not stored for a reason the user should know about."""
        return self.malformed + self.no_loss_tokens + self.too_long + self.nonfinite + self.failed

    def add(self, other: ExtractStats) -> None:
        """Accumulate another rank's counts (wall time: the slowest rank)."""
        for name, value in asdict(other).items():
            if name == "wall_s":
                self.wall_s = max(self.wall_s, value)
            else:
                setattr(self, name, getattr(self, name) + value)


