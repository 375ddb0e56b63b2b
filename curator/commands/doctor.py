"""`curator doctor`: is this draft deployable, and will this server command use it as trained."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from curator.doctor import DoctorReport, diagnose
from curator.ui import console, rows_table, stdout

STATUS_STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "error": "[bold red]error[/]"}


def doctor(
    draft: Annotated[Path, typer.Option("--draft", help="Exported draft directory (curator export).")],
    model: Annotated[Optional[Path], typer.Option("--model", help="Local target model directory.")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Hidden-state store the draft was trained on.")] = None,
    launch: Annotated[Optional[str], typer.Option("--launch", help="The SGLang or vLLM launch command, quoted.")] = None,
) -> int:
    """Check a draft export, its fit with the target and data, and a server launch command."""
    report = diagnose(draft, model, data, launch)
    render_doctor(report)
    if not report.ok:
        raise typer.Exit(1)
    return 0


def render_doctor(report: DoctorReport) -> None:
    """Print the checks as a table (stderr) and the correct launch command (stdout, to copy)."""
    table = rows_table(["check", "status", "detail"], [], title="curator doctor")
    for check in report.checks:
        table.add_row(check.name, STATUS_STYLE[check.status], check.detail)
    console.print(table)
    n_err, n_warn = len(report.errors), sum(c.status == "warn" for c in report.checks)
    verdict = "[bold red]not deployable as is[/]" if n_err else "[green]ready to serve[/]"
    console.print(f"{verdict}: {n_err} error(s), {n_warn} warning(s). Launch it with:")
    stdout.print(report.launch_command, highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add `doctor` to the CLI."""
    app.command("doctor")(doctor)
