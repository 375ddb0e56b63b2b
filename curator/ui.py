"""Terminal output shared by every command: one rich console, progress bars and summary tables.

Results (tables a user asked for) go to stdout; messages, progress and end-of-run summaries to
stderr, so that `--format csv|json` output on stdout stays clean. Neither console hard-wraps
text: a message written to a log file keeps a command or path on one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table
from rich.text import Text

console = Console(stderr=True, soft_wrap=True)
stdout = Console(soft_wrap=True)


class RateColumn(ProgressColumn):
    """Items per second over the task's recent window; nothing until there is a rate (no "-/s")."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.1f}/s", style="cyan")


class EtaColumn(TimeRemainingColumn):
    """"ETA" and the time left; nothing at all where the total is unknown (a log read to its end, a
    mix built until its quotas fill), where "ETA" would stand beside an empty cell."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        return Text.assemble("ETA ", super().render(task))


def progress(*extra_columns: ProgressColumn) -> Progress:
    """Return a progress display: items done/total and ETA first, then rate, elapsed time, a bar and
    the extra columns (a run's loss, a server's rate). Nothing is cut: where a line does not fit the
    terminal (80 columns, say), each task's extra columns go on a line of their own under its bar."""
    fixed = Column(no_wrap=True)
    for column in extra_columns:
        column._table_column = Column(no_wrap=True)  # its constructor's table_column: whole, never "…"
    return _ShownWithItsFirstTask(
        TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=28)),
        MofNCompleteColumn(table_column=fixed),
        EtaColumn(table_column=fixed),
        RateColumn(table_column=fixed),
        TimeElapsedColumn(table_column=fixed),
        BarColumn(bar_width=12, table_column=fixed),
        *extra_columns,
        console=console,
        transient=False,
        extra=len(extra_columns),
    )


class _ShownWithItsFirstTask(Progress):
    """A progress display that starts with its first task, so that a command refusing its input
    before it has work to show draws no empty `0/?` bar and leaves no blank line; it lays its
    tasks out for the width it is drawn at (see _Tasks)."""

    def __init__(self, *columns: ProgressColumn, extra: int = 0, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.extra = extra

    def __enter__(self) -> _ShownWithItsFirstTask:
        return self

    def add_task(self, *args: Any, **kwargs: Any) -> TaskID:
        self.start()  # a no-op once started
        return super().add_task(*args, **kwargs)

    def stop(self) -> None:
        if self.live.is_started:  # rich would print a blank line for a display never shown
            super().stop()

    def get_renderables(self) -> Iterable[Any]:
        yield _Tasks(self)

    def tasks_table(self, columns: Sequence[Any], tasks: Iterable[Task]) -> Table:
        """Return `tasks` as a table of `columns` (some of this display's own)."""
        saved = self.columns
        self.columns = tuple(columns)
        try:
            return self.make_tasks_table(tasks)
        finally:
            self.columns = saved


class _Tasks:
    """The tasks of a progress display at the width they are drawn at: one line each where the
    line fits; else each task's bar line, then its extra columns on the next line, indented and
    folded (a loss, a rate or a kept count is read whole, never "…")."""

    def __init__(self, display: _ShownWithItsFirstTask) -> None:
        self.display = display

    def __rich_console__(self, console: Console, options: Any) -> Any:
        display, width = self.display, options.max_width
        tasks = [t for t in display.tasks if t.visible]
        table = display.make_tasks_table(tasks)
        natural = console.measure(table, options=options.update(width=10_000)).maximum  # unclamped by the width
        if not display.extra or natural <= width:
            yield table
            return
        essential, extra = display.columns[: -display.extra], display.columns[-display.extra:]
        for task in tasks:
            yield display.tasks_table(essential, [task])
            status = Table.grid(*(Column(overflow="fold") for _ in extra), padding=(0, 1))
            # a column given as a format string is drawn as rich draws it
            status.add_row(*(column.format(task=task) if isinstance(column, str) else column(task) for column in extra))
            yield Padding(status, (0, 0, 0, 2))


def fit_line(pieces: Sequence[str], width: int | None = None, indent: int = 2) -> str:
    """Return `pieces` joined by two spaces on as few lines as fit `width` (the console's), breaking
    only between pieces: a label and its number never end up on different lines."""
    width = width or console.width
    lines: list[str] = []
    for piece in pieces:
        if lines and cell_len(lines[-1]) + 2 + cell_len(piece) <= width:
            lines[-1] += "  " + piece
        else:
            lines.append((" " * indent if lines else "") + piece)
    return "\n".join(lines)


def quiet_library_progress() -> None:
    """Turn off the bars transformers and huggingface_hub draw on their own (loading weights,
    writing shards): they would interleave with the toolkit's progress lines."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    disable_progress_bars()
    transformers_logging.disable_progress_bar()


class Value:
    """A table cell right-aligned while it fits on one line, as numbers line up; text that must
    wrap (a rationale, a long path) reads left-aligned, as prose does."""

    def __init__(self, text: str) -> None:
        self.text = Text(text)  # values are data (paths, ids, errors), never markup

    def __rich_measure__(self, console: Console, options: Any) -> Measurement:
        return Measurement.get(console, options, self.text)

    def __rich_console__(self, console: Console, options: Any) -> Any:
        text = self.text.copy()
        text.justify = "right" if self.text.cell_len <= options.max_width else "left"
        yield text


def summary_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    """Return a two-column table (what, value) for the end of a long command."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, Value(format_value(value)))
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
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    title: str | None = None,
    *,
    whole: Sequence[str] = (),
    optional: Sequence[str] = (),
) -> CompactTable:
    """Return query results laid out for the width they are printed at (see CompactTable).

    `whole` names columns never cut besides those whose name says they hold an id; `optional`
    names columns that may be left out (with a note) before the table turns to one block per row.
    """
    return CompactTable([str(c) for c in columns], [[_one_line(format_value(v)) for v in row] for row in rows],
                        title, frozenset(whole), tuple(optional))


# Column names whose values a user copies or tells rows apart by: never cut.
ID_COLUMN = re.compile(r"(^|_)(id|ids|dataset|datasets|source|name|path|file|run)$", re.IGNORECASE)


class CompactTable:
    """Query results that stay readable at any width, as psql's `\\x auto` and DuckDB's CLI do.

    In order, the first layout that fits the width:
    1. one line per row, every value whole;
    2. one line per row, long free-text values cut with "…" (never an id, a number or a header);
    3. the same without the `optional` columns, with a note naming them;
    4. one block per row ("record 1 of 18", then a line per column), values folded whole,
       free text cut after RECORD_TEXT_LINES lines.
    """

    GAP = 2  # spaces between columns
    MIN_CUT = 12  # a cut value keeps at least this many characters
    RECORD_TEXT_LINES = 4

    def __init__(self, columns: list[str], cells: list[list[str]], title: str | None, whole: frozenset[str],
                 optional: tuple[str, ...] = ()) -> None:
        self.columns, self.cells, self.title, self.optional = columns, cells, title, optional
        self.whole = frozenset(c for c in columns if c in whole or ID_COLUMN.search(c))
        self.numeric = [all(_NUMBER.fullmatch(row[i]) for row in cells if row[i]) for i in range(len(columns))]
        # each column's width with every value whole: measured once, read by every layout tried
        self.natural = [max([cell_len(c)] + [cell_len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def _cuttable(self, i: int) -> bool:
        return self.columns[i] not in self.whole and not self.numeric[i]

    def widths(self, width: int, shown: Sequence[int]) -> list[int] | None:
        """Return the widths of the `shown` columns on one line of `width`, or None when none fit."""
        natural = {i: self.natural[i] for i in shown}
        floor = {i: natural[i] if not self._cuttable(i) else
                 min(natural[i], max(cell_len(self.columns[i]), self.MIN_CUT)) for i in shown}
        room = width - self.GAP * (len(shown) - 1)
        if sum(floor.values()) > room:
            return None
        # the largest cap on the cuttable columns that fits; a column under the cap keeps its width
        cap = max(natural.values(), default=0)
        while sum(max(floor[i], min(natural[i], cap)) for i in shown) > room:
            cap -= 1
        return [max(floor[i], min(natural[i], cap)) for i in shown]

    def layout(self, width: int) -> tuple[list[int], list[int]] | None:
        """Return (shown column indexes, their widths) for one line per row, or None for blocks."""
        shown = list(range(len(self.columns)))
        for name in (None, *self.optional):
            if name is not None and name in self.columns:
                shown.remove(self.columns.index(name))
            widths = self.widths(width, shown)
            if widths is not None:
                return shown, widths
        return None

    def __rich_console__(self, console: Console, options: Any) -> Any:
        width = options.max_width
        if self.title:
            yield Text(self.title, style="bold")
        chosen = self.layout(width) if self.columns else ([], [])
        if chosen is None:
            yield from self._records(console, width)
            return
        shown, widths = chosen

        def line(values: list[str], header: bool = False) -> Text:
            text = Text(no_wrap=True, overflow="ellipsis", style="bold" if header else "")
            for n, (i, w) in enumerate(zip(shown, widths)):
                cell = Text(values[i])
                cell.truncate(w, overflow="ellipsis")
                pad = " " * (w - cell.cell_len)
                if n:
                    text.append(" " * self.GAP)
                text.append_text(Text(pad) + cell if self.numeric[i] and not header else cell + Text(pad))
            text.rstrip()
            return text

        yield line(self.columns, header=True)
        yield Text(" " * self.GAP).join(Text("─" * w) for w in widths)
        for row in self.cells:
            yield line(row)
        left_out = [c for i, c in enumerate(self.columns) if i not in shown]
        if left_out:
            them = "them" if len(left_out) > 1 else "it"
            yield Text(f"not shown at {width} columns: {', '.join(left_out)} (a wider terminal shows {them})",
                       style="dim")

    def _records(self, console: Console, width: int) -> Any:
        """Yield one block per row: a numbered rule, then `column  value` lines, values folded."""
        key_width = min(max(cell_len(c) for c in self.columns), max(8, width // 3))
        room = max(8, width - key_width - self.GAP)
        for n, row in enumerate(self.cells, 1):
            label = f"─[ record {n} of {len(self.cells)} ]"
            yield Text(label + "─" * max(0, min(width, 40) - cell_len(label)), style="dim")
            for name, value in zip(self.columns, row):
                keys = Text(name, style="bold").wrap(console, key_width, overflow="fold")
                values = self._record_lines(console, name, value, room)
                for k in range(max(len(keys), len(values))):
                    key = keys[k] if k < len(keys) else Text()
                    line = key + Text(" " * (key_width - key.cell_len + self.GAP))
                    if k < len(values):
                        line.append_text(values[k])
                    line.rstrip()
                    yield line

    def _record_lines(self, console: Console, name: str, value: str, room: int) -> list[Text]:
        """Return a value folded to `room` for a record block: whole, except free text past
        RECORD_TEXT_LINES lines, which ends in "…"."""
        lines = list(Text(value).wrap(console, room, overflow="fold"))
        i = self.columns.index(name)
        if len(lines) > self.RECORD_TEXT_LINES and name not in self.whole and not self.numeric[i]:
            lines = lines[: self.RECORD_TEXT_LINES]
            lines[-1].rstrip()
            lines[-1].truncate(room - 1)
            lines[-1].append("…")
        return lines


_NUMBER = re.compile(r"-?[\d,]*\.?\d+(e[+-]?\d+)?%?")


def _one_line(text: str) -> str:
    """Return `text` on one line (a newline would make a row taller than one line)."""
    return " ".join(text.split()) if "\n" in text or "\t" in text else text


def format_value(value: Any) -> str:
    """Return `value` as a short human string (None empty; floats to 4 significant digits, or
    whole with thousands separators from 1,000 up: never an exponent a reader must decode)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if math.isfinite(value) and abs(value) >= 1000 else f"{value:.4g}"
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
