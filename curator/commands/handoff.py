"""`curator export-data`: the curated rows (and hidden states) in speculators', SpecForge's or ModelOpt's layout,
and `--check` of an export against its trainer's traps (docs/own-trainer.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from curator.errors import ConfigError
from curator.ui import console, progress, rows_table, stdout, summary_table

LEVEL_STYLE = {"ok": "green", "warn": "yellow", "error": "red"}


def export_data_command(
    out: Annotated[Path, typer.Option("--out", help="The export folder (published whole; an earlier export there is replaced).")],
    layout: Annotated[Optional[str], typer.Option("--layout", help="speculators, specforge-offline, specforge-online or modelopt.")] = None,
    store: Annotated[Optional[Path], typer.Option("--store", help="A `curator hidden-states` store: its rows and states.")] = None,
    records: Annotated[Optional[Path], typer.Option("--records", help="A `curator generate --out` folder: the rows to export (token mode), checked against --store.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", help="The target's model folder (the store is checked against its config) or Hub id, for the launch line.")] = None,
    fp8_to_bf16: Annotated[bool, typer.Option("--fp8-to-bf16", help="Write an fp8 store's states dequantised to bf16 (refused otherwise).")] = False,
    check: Annotated[bool, typer.Option("--check", help="Check the export at --out instead: its files, --trainer-config, the trainer's traps.")] = False,
    trainer_config: Annotated[Optional[Path], typer.Option("--trainer-config", help="With --check: the trainer's run config (YAML/JSON) to check against the export.")] = None,
) -> None:
    """Write curated data in another trainer's layout (speculators, SpecForge, ModelOpt), published whole; --check one."""
    from curator.handoff.checks import check_export

    if check:
        findings = check_export(out, trainer_config)
        stdout.print(rows_table(["", "check", "finding"], [(f.level, f.name, f.message) for f in findings],
                                title=f"export-data --check {out}"))
        errors = [f for f in findings if f.level == "error"]
        if errors:
            raise ConfigError(f"{len(errors)} check(s) failed: {', '.join(f.name for f in errors)}")
        return
    if layout is None:
        raise ConfigError("--layout is required: speculators, specforge-offline, specforge-online or modelopt")
    if trainer_config is not None:
        raise ConfigError("--trainer-config goes with --check (check the export after writing it)")
    from curator.handoff.export import export_data

    with progress() as bar:
        task = bar.add_task(f"export-data {layout}", total=None)
        report = export_data(layout, out, store=store, records=records, target=target, fp8_to_bf16=fp8_to_bf16,
                             on_row=lambda n: bar.advance(task, n))
    console.print(summary_table(f"export-data {layout}", [
        ("rows", report.rows), ("tokens", report.tokens), ("loss-masked tokens", report.loss_tokens),
        ("files", report.files), ("bytes", report.bytes_written),
        ("aux layer ids (trainer's numbering)", report.aux_layer_ids if report.aux_layer_ids is not None else "-"),
        ("out", str(report.out))]))
    for trap in report.traps:
        console.print(f"[yellow]trap[/] {trap.name}: {trap.message}", highlight=False)
    stdout.print(report.launch, highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `export-data` to the CLI."""
    app.command("export-data")(export_data_command)
