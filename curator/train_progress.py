"""A draft's training as the user watches it: the progress bar fed by the trainer's metrics and the
acceptance rows of its summary, shared by `curator train` and the demo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.progress import Progress, TaskID, TextColumn

from curator.loss_report import loss_text
from curator.ui import fit_line, progress


def format_acc(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def accept_length_rows(record: dict[str, Any], split: str) -> dict[str, float | None]:
    """Return a metrics record's acceptance lengths, each named with its chain length K (the most
    it can be is K + 1): the teacher-forced one over the TTT steps, and the simulated one."""
    rows: dict[str, float | None] = {}
    if record.get("accept_length") is not None:
        rows[f"{split} accept length (teacher-forced, K={len(record.get('cond_acc') or record['acc'])})"] = \
            record["accept_length"]
    if record.get("sim_accept_length") is not None:
        rows[f"{split} simulated accept length (K={record.get('sim_steps', '?')})"] = record["sim_accept_length"]
    return rows


def training_progress(description: str = "train") -> tuple[Progress, Callable[[dict[str, Any]], None]]:
    """Return a progress display for a draft's training and the trainer's `on_metrics` callback
    that feeds it (a bar for the train steps, a line per eval)."""
    bar = progress(TextColumn("{task.fields[status]}"))
    return bar, training_metrics(bar, description)


def training_metrics(bar: Progress, description: str) -> Callable[[dict[str, Any]], None]:
    """Return an `on_metrics` callback that draws one run's training as a task of `bar` named
    `description` (several runs may share one display: `curator forecast` trains one per subset)."""
    tasks: list[TaskID] = []  # added at the first record: a run refused while it sets up draws no bar

    def show(record: dict[str, Any]) -> None:
        if record["split"] == "train":
            if not tasks:
                tasks.append(bar.add_task(description, total=record["total_steps"], status=""))
            bar.update(tasks[0], completed=record["step"], total=record["total_steps"],
                       status=f"{loss_text(record)}  acc {format_acc(record['acc'][:3])}  "
                              f"τ {record['accept_length']:.2f}  {record['tokens_per_s']:,.0f} tok/s")
        else:
            # broken between a label and the next, never inside one: at 80 columns a number stays by its name
            line = fit_line([f"eval step {record['step']}:", loss_text(record), f"acc {format_acc(record['acc'])}",
                             f"accept length {record['accept_length']:.3f}",
                             f"simulated {record.get('sim_accept_length', float('nan')):.3f}"], bar.console.width)
            bar.console.print(line, highlight=False, markup=False)

    return show
