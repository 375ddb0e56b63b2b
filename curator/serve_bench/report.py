"""What `curator bench-serve` measured, per endpoint, concurrency and category, and its verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from curator.serve_bench.client import RequestResult

# within this band of 1.0x the draft neither helps nor hurts measurably on a short benchmark
EVEN_BAND = 0.02


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass
class GroupResult:
    """One category's prompts sent to one endpoint at one concurrency."""

    endpoint: str  # "draft" or "baseline"
    concurrency: int
    category: str
    requests: list[RequestResult]
    wall_s: float
    acceptance_length: float | None = None  # the engine's own figure (None: baseline, or not reported)
    position_rates: list[float] = field(default_factory=list)  # vLLM only

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        """Return aggregate output tokens per second: all requests' tokens over the group's wall time."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        tpot = [t for r in self.requests if (t := r.time_per_output_token_s) is not None]
        return {
            "endpoint": self.endpoint, "concurrency": self.concurrency, "category": self.category,
            "requests": len(self.requests), "output_tokens": self.output_tokens, "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "request_tokens_per_s": _mean([r.tokens_per_s for r in self.requests]),
            "time_per_output_token_ms": 1000 * _mean(tpot),
            "ttft_ms": 1000 * _mean([r.ttft_s for r in self.requests]),
            "acceptance_length": self.acceptance_length, "position_rates": self.position_rates,
        }


def sglang_acceptance(requests: list[RequestResult]) -> float | None:
    """Return SGLang's acceptance over requests: their tokens over their verify forwards."""
    verify = [r.verify_ct for r in requests]
    if not requests or any(v is None for v in verify) or not sum(verify):  # type: ignore[arg-type]
        return None
    return sum(r.output_tokens for r in requests) / sum(verify)  # type: ignore[arg-type]


def verdict(speedup: float | None) -> str:
    """Return the one line a user decides on, e.g. "speedup 0.91x: slower than no speculation"."""
    if speedup is None or not math.isfinite(speedup):
        return "speedup unknown: no baseline endpoint (give --baseline, a server without the draft)"
    if speedup < 1 - EVEN_BAND:
        return f"speedup {speedup:.2f}x: slower than no speculation"
    if speedup > 1 + EVEN_BAND:
        return f"speedup {speedup:.2f}x: faster than no speculation"
    return f"speedup {speedup:.2f}x: no faster than no speculation"


@dataclass
class ServeBenchReport:
    """Every group measured, with the aggregate and verdict per concurrency."""

    prompts_source: str
    max_tokens: int
    temperature: float = 0.0  # 0: greedy requests
    groups: list[GroupResult] = field(default_factory=list)

    def total(self, endpoint: str, concurrency: int) -> tuple[int, float]:
        """Return (output tokens, wall seconds) of an endpoint over all categories at one concurrency."""
        gs = [g for g in self.groups if g.endpoint == endpoint and g.concurrency == concurrency]
        return sum(g.output_tokens for g in gs), sum(g.wall_s for g in gs)

    def concurrencies(self) -> list[int]:
        return sorted({g.concurrency for g in self.groups})

    def tokens_per_s(self, endpoint: str, concurrency: int) -> float | None:
        tokens, wall = self.total(endpoint, concurrency)
        return tokens / wall if wall > 0 else None

    def acceptance_length(self, concurrency: int) -> float | None:
        """Return the draft endpoint's acceptance over all categories (verify-weighted)."""
        gs = [g for g in self.groups if g.endpoint == "draft" and g.concurrency == concurrency]
        if not gs or any(g.acceptance_length is None for g in gs):
            return None
        # tokens / verify forwards over all groups: each group's forwards = its tokens / its length
        forwards = sum(g.output_tokens / g.acceptance_length for g in gs if g.acceptance_length)
        return sum(g.output_tokens for g in gs) / forwards if forwards else None

    def speedup(self, concurrency: int) -> float | None:
        draft, base = self.tokens_per_s("draft", concurrency), self.tokens_per_s("baseline", concurrency)
        return draft / base if draft and base else None

    def verdicts(self) -> dict[int, str]:
        return {c: verdict(self.speedup(c)) for c in self.concurrencies()}

    def to_json(self) -> dict[str, Any]:
        from training.eval.evaluate import finite

        return finite({
            "prompts": self.prompts_source, "max_tokens": self.max_tokens, "temperature": self.temperature,
            "concurrency": {str(c): {"draft_tokens_per_s": self.tokens_per_s("draft", c),
                                     "baseline_tokens_per_s": self.tokens_per_s("baseline", c),
                                     "acceptance_length": self.acceptance_length(c),
                                     "speedup": self.speedup(c), "verdict": verdict(self.speedup(c))}
                            for c in self.concurrencies()},
            "groups": [g.to_json() for g in self.groups],
        })
