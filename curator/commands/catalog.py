"""`curator sql` and `curator catalog list|show|approve|reject`: review the scouts' findings."""

from __future__ import annotations

import csv
import json
import sys
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from curator.catalog import Catalog, resolve_path
from curator.errors import CatalogError
from curator.sql import run_sql
from curator.ui import compact_table, console, stdout, summary_table

CatalogOption = typer.Option(None, "--catalog", help="Catalog file (default: $CURATOR_CATALOG or ./catalog.duckdb).")


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    markdown = "markdown"


def sql(
    statement: str = typer.Argument(..., help="SQL for review, reads and row changes: SELECT (also over local files: "
                                   "'mix/*.parquet'), UPDATE, INSERT, DELETE; several separated by ';' run as one "
                                   "transaction, all or nothing (a final ROLLBACK makes a dry run). Schema changes (DROP, ALTER, "
                                   "CREATE, ATTACH, COPY, ...), also under EXPLAIN, and changes to curator's "
                                   "schema_version are refused. A SELECT reads any file you can "
                                   "(read_csv('/etc/passwd')): your own power, never the toolkit's."),
    format: OutputFormat = typer.Option(
        OutputFormat.table, "--format", "-f",
        help="table (for reading: a line per row, or a block per row when too wide; long free text cut), "
             "or csv, json, markdown (whole values, for scripts).",
    ),
    catalog: Optional[Path] = CatalogOption,
) -> None:
    """Run SQL against the catalog (or over parquet files) and print every result."""
    results = run_sql(statement, catalog)
    shown = [r for r in results if r.columns]
    if not shown:
        console.print("[green]ok[/]")
    if format is OutputFormat.json and len(shown) > 1:
        sys.stdout.write(json.dumps([_records(r.columns, r.rows) for r in shown], indent=1) + "\n")
        return
    for i, result in enumerate(shown):
        if i:
            sys.stdout.write("\n")
        write_rows(result.columns, result.rows, format)


def write_rows(columns: list[str], rows: list[tuple[Any, ...]], format: OutputFormat) -> None:
    """Print query results to stdout as a compact table, CSV, JSON (one array of objects) or Markdown."""
    if format is OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_plain(v) for v in row] for row in rows])
    elif format is OutputFormat.json:
        sys.stdout.write(json.dumps(_records(columns, rows), indent=1) + "\n")
    elif format is OutputFormat.markdown:
        sys.stdout.write(_markdown(columns, rows))
    else:
        stdout.print(compact_table(columns, rows))
        console.print(f"{len(rows)} row{'s' if len(rows) != 1 else ''}")


def _records(columns: list[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, map(_plain, row))) for row in rows]


def _markdown(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """Return a GitHub-flavoured Markdown table (pipes escaped, one line per row)."""

    def cell(value: Any) -> str:
        text = "" if value is None else str(_plain(value))
        return " ".join(text.split()).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    """Return a JSON/CSV-friendly form of a DuckDB value."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _existing(catalog: Optional[Path]) -> Catalog:
    """Return the catalog to review; CatalogError, creating nothing, when there is none there yet."""
    path = resolve_path(catalog)
    if not path.exists():
        raise CatalogError(f"no catalog at {path} yet: run `curator scout` first, or pass --catalog FILE "
                           "(the demo's is in its workdir: --catalog curator-demo/catalog.duckdb)")
    return Catalog.open(path)


catalog_app = typer.Typer(help="Review candidate datasets: list, show, approve, reject.", no_args_is_help=True)


@catalog_app.command("list")
def list_candidates(
    status: Optional[str] = typer.Option(None, help="Only this status: proposed, approved or rejected."),
    limit: int = typer.Option(50, help="At most this many rows."),
    catalog: Optional[Path] = CatalogOption,
) -> None:
    """List candidates, most relevant first."""
    rows = _existing(catalog).candidates(status=status, limit=limit)
    columns = ["id", "dataset_id", "category", "relevance", "samples", "status"]  # the agent: `catalog show`
    table = [[r["id"], r["dataset_id"], r["category"], r["relevance"], _samples(r), r["status"]] for r in rows]
    # At 80 columns a long dataset id leaves no room for the category: it goes first, with a note.
    stdout.print(compact_table(columns, table, title="candidates", optional=("category",)))


def _samples(row: dict[str, Any]) -> int | None:
    """Return the sample count a candidate stands for: the approved one, else the suggested one."""
    return row["approved_samples"] if row["approved_samples"] is not None else row["suggested_samples"]


@catalog_app.command("show")
def show(candidate_id: int = typer.Argument(..., help="Candidate id."), catalog: Optional[Path] = CatalogOption) -> None:
    """Show one candidate with its dataset's metadata and every agent's rationale for it."""
    cat = _existing(catalog)
    with cat.session():  # one open of the file for both reads
        row = cat.candidate(candidate_id)
        columns, others = cat.query(
            "SELECT id, agent, relevance, status, rationale FROM candidates WHERE dataset_id = ? AND id <> ? "
            "ORDER BY relevance DESC",
            [row["dataset_id"], candidate_id],
        )
    stdout.print(summary_table(f"candidate {candidate_id}", [(k, _plain(v)) for k, v in row.items()]))
    if others:
        stdout.print(compact_table(columns, others, title=f"other findings of {row['dataset_id']}"))


@catalog_app.command("approve")
def approve(
    candidate_id: int = typer.Argument(..., help="Candidate id."),
    samples: Optional[int] = typer.Option(None, "--samples", help="Override the suggested sample count."),
    catalog: Optional[Path] = CatalogOption,
) -> None:
    """Approve a candidate for the mix."""
    row = _existing(catalog).approve(candidate_id, samples)
    n = row["approved_samples"] if row["approved_samples"] is not None else row["suggested_samples"]
    console.print(f"[green]approved[/] {candidate_id} {escape(row['dataset_id'])} ({n:,} samples)")


@catalog_app.command("reject")
def reject(
    candidate_id: int = typer.Argument(..., help="Candidate id."),
    note: Optional[str] = typer.Option(None, "--note", help="Why, for the next reviewer."),
    catalog: Optional[Path] = CatalogOption,
) -> None:
    """Reject a candidate."""
    row = _existing(catalog).reject(candidate_id, note)
    console.print(f"[yellow]rejected[/] {candidate_id} {escape(row['dataset_id'])}")


def register(app: typer.Typer) -> None:
    """Add `sql` and `catalog` to the CLI."""
    app.command("sql")(sql)
    app.add_typer(catalog_app, name="catalog")
