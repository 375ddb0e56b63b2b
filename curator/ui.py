"""Terminal output shared by every command: one rich console, progress bars and summary tables.

Progress and tables go to stderr so that `--format csv|json` output on stdout stays clean.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

console = Console(stderr=True)
stdout = Console(soft_wrap=True)


class RateColumn(ProgressColumn):
    """Items per second over the task's recent window."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-/s" if speed is None else f"{speed:,.1f}/s", style="cyan")


def progress(*extra_columns: Any) -> Progress:
    """Return a progress display with items done/total, rate, elapsed time and ETA."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        *extra_columns,
        console=console,
        transient=False,
    )


def summary_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    """Return a two-column table (what, value) for the end of a long command."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, Text(format_value(value)))  # values are data (paths, ids, errors), never markup
    return table


def rows_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> Table:
    """Return a table with the given header and rows, values formatted for reading."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*(Text(format_value(v)) for v in row))  # cells are data, never markup
    return table


def format_value(value: Any) -> str:
    """Return `value` as a short human string (floats to 4 significant digits, None empty)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def human_bytes(n: float) -> str:
    """Return a byte count in decimal units (GB, TB), as disks are sold."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} PB"
