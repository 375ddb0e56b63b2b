"""`curator plan --epochs/--cache-budget/--capture-rate`: the feed choices of training.capture.feed_plan as a table."""

from __future__ import annotations

import re
from typing import Any

from rich.table import Table
from rich.text import Text

from curator.errors import ConfigError
from curator.ui import human_bytes
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


def _feed_name(name: str) -> str:
    """Return a feed's name with its byte budget in readable units ("cache up to 500.0 GB")."""
    return re.sub(r"(\d[\d,]*) B\b", lambda m: human_bytes(int(m.group(1).replace(",", ""))), name)


def feed_table(choices: list[FeedChoice], capture_rate: float | None, servers: int) -> Any:
    """Return the feeds side by side, one column each, a row per figure: three feeds and six
    figures fit 80 columns with every number whole, where a column per figure cut them all."""
    rate = f"capture time at {capture_rate:,.0f} tok/s x {servers}" if capture_rate else "capture time (--capture-rate)"
    table = Table(title="feeding the trainer: full store vs engine-fed", title_justify="left")
    table.add_column("", style="bold", overflow="fold")
    for c in choices:
        table.add_column(_feed_name(c.name), justify="right", overflow="fold")
    figures: list[tuple[str, list[str]]] = [
        ("disk high-water (at most)", [human_bytes(c.disk_high_water) for c in choices]),
        ("window (host memory)", [human_bytes(c.window_bytes) if c.window_bytes else "-" for c in choices]),
        # one epoch a line: "1: 210,300,000" stays whole where "210,300,000 / 0 / 0" was cut
        ("prefill per epoch (tokens)", ["\n".join(f"{e}: {t:,}" for e, t in enumerate(c.prefill_per_epoch, 1))
                                        for c in choices]),
        ("prefill total (tokens)", [f"{c.prefill_total:,}" for c in choices]),
        (rate, [_duration(c.capture_s) for c in choices]),
    ]
    if any(c.notes for c in choices):
        figures.append(("note", ["; ".join(c.notes) or "-" for c in choices]))
    for label, values in figures:
        # cells are data, never markup; a note is prose, read left-aligned
        table.add_row(Text(label), *(Text(v, justify="left" if label == "note" else None) for v in values))
    return table
