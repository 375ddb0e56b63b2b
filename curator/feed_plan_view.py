"""`curator plan --epochs/--cache-budget/--capture-rate`: the feed choices of training.capture.feed_plan as a table."""

from __future__ import annotations

from typing import Any

from curator.errors import ConfigError
from curator.ui import human_bytes, rows_table
from training.capture.feed_plan import FeedChoice, price_feeds
from training.capture.plan import DiskPlan
from training.errors import TrainingError
from training.feed.engine import parse_bytes


def feed_choices(plan: DiskPlan, *, epochs: int, cache_budget: str | None, capture_rate: float | None,
                 servers: int, prefetch_samples: int) -> list[FeedChoice]:
    """Return the store / capture-every-epoch / cache-budget choices for the plan's chosen clip."""
    try:
        budget = parse_bytes(cache_budget or "")
        return price_feeds(tokens=plan.chosen.tokens, samples=plan.samples, bytes_per_token=plan.store_bytes_per_token,
                           epochs=epochs, cache_budget=budget, window_samples=prefetch_samples,
                           capture_rate=capture_rate, servers=servers)
    except TrainingError as exc:
        raise ConfigError(str(exc)) from exc


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 3600:,.1f} h" if s >= 3600 else f"{s:,.0f} s"


def feed_table(choices: list[FeedChoice], capture_rate: float | None, servers: int) -> Any:
    rate = f"capture time at {capture_rate:,.0f} tok/s x {servers}" if capture_rate else "capture time (--capture-rate)"
    return rows_table(
        ["feed", "disk high-water (at most)", "window (host memory)", "prefill/epoch (tokens)", "prefill total", rate,
         "note"],
        [(c.name, human_bytes(c.disk_high_water), human_bytes(c.window_bytes) if c.window_bytes else "-",
          " / ".join(f"{t:,}" for t in c.prefill_per_epoch),
          f"{c.prefill_total:,}", _duration(c.capture_s), "; ".join(c.notes)) for c in choices],
        title="feeding the trainer: full store vs engine-fed",
    )
