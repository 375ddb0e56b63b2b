"""Terminal output shared by every command: one rich console, progress bars and summary tables.

Results (tables a user asked for) go to stdout; messages, progress and end-of-run summaries to
stderr, so that `--format csv|json` output on stdout stays clean. Neither console hard-wraps
text: a message written to a log file keeps a command or path on one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
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
from rich.table import Column, Table
from rich.text import Text

console = Console(stderr=True, soft_wrap=True)
stdout = Console(soft_wrap=True)


class RateColumn(ProgressColumn):
    """Items per second over the task's recent window."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-/s" if speed is None else f"{speed:,.1f}/s", style="cyan")


# What the columns before the extra ones take on a line: a 12-character description, up to
# 999,999/999,999 items, ETA and elapsed times, the rate and the bar, with the gaps between them.
ESSENTIAL_PROGRESS_WIDTH = 58


def progress(*extra_columns: ProgressColumn) -> Progress:
    """Return a progress display: items done/total and ETA first, then rate, elapsed time, a bar
    and the extra columns, which alone are cut ("…") when the line is wider than the terminal."""
    fixed = Column(no_wrap=True)
    room = max(12, console.width - ESSENTIAL_PROGRESS_WIDTH)
    for column in extra_columns:
        column._table_column = Column(no_wrap=True, overflow="ellipsis", max_width=room)  # its constructor's table_column
    return Progress(
        TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=28)),
        MofNCompleteColumn(table_column=fixed),
        TextColumn("ETA", table_column=fixed),
        TimeRemainingColumn(table_column=fixed),
        RateColumn(table_column=fixed),
        TimeElapsedColumn(table_column=fixed),
        BarColumn(bar_width=12, table_column=fixed),
        *extra_columns,
        console=console,
        transient=False,
    )


def quiet_library_progress() -> None:
    """Turn off the bars transformers and huggingface_hub draw on their own (loading weights,
    writing shards): they would interleave with the toolkit's progress lines."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    disable_progress_bars()
    transformers_logging.disable_progress_bar()


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


def compact_table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None, *, whole: Sequence[str] = ()
) -> CompactTable:
    """Return a compact table of data (query results): one line per row, a cell too long for its
    column cut with "…", values shown as they are (no markup).

    Every column is shown at any width: the widest columns give up space first. Headers wrap
    rather than being cut, and the columns named in `whole` (ids a user copies) are never cut.
    """
    return CompactTable([str(c) for c in columns], [[_one_line(format_value(v)) for v in row] for row in rows],
                        title, frozenset(whole))


class CompactTable:
    """A table laid out for the width it is printed at (see compact_table)."""

    GAP = 3  # between columns: two of padding, one of the (blank) divider

    def __init__(self, columns: list[str], cells: list[list[str]], title: str | None, whole: frozenset[str]) -> None:
        self.columns, self.cells, self.title, self.whole = columns, cells, title, whole

    def widths(self, width: int) -> list[int]:
        """Return each column's width for a row that fits in `width`.

        A `whole` column takes up to half the width (a longer value folds onto a second line);
        the others share the rest: the largest cap that fits is found, and a column narrower
        than the cap keeps its natural width.
        """
        natural = [max([len(c)] + [len(row[i]) for row in self.cells]) for i, c in enumerate(self.columns)]
        fixed = {i: min(n, max(width // 2, 20)) for i, n in enumerate(natural) if self.columns[i] in self.whole}
        room = width - self.GAP * (len(self.columns) - 1) - sum(fixed.values())
        free = [n for i, n in enumerate(natural) if i not in fixed]
        cap = max(free, default=0)
        while cap > 4 and sum(min(n, cap) for n in free) > room:
            cap -= 1
        return [fixed[i] if i in fixed else min(n, cap) for i, n in enumerate(natural)]

    def __rich_console__(self, console: Console, options: Any) -> Any:
        table = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                      show_edge=False)
        for name, w in zip(self.columns, self.widths(options.max_width)):
            table.add_column(name, width=w, overflow="fold")
        for row in self.cells:
            table.add_row(*(Text(cell, no_wrap=name not in self.whole, overflow="fold" if name in self.whole else "ellipsis")
                            for name, cell in zip(self.columns, row)))
        yield table


def _one_line(text: str) -> str:
    """Return `text` on one line (a newline would make a row taller than one line)."""
    return " ".join(text.split()) if "\n" in text or "\t" in text else text


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
