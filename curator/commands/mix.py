"""`curator build-mix`: build a prompt mix from a recipe or from the catalog's approved candidates."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape
from rich.progress import Progress, TaskID

from curator.errors import ConfigError
from curator.mix.online import OFFLINE_ENV
from curator.ui import console, progress, rows_table, stdout, summary_table

if TYPE_CHECKING:  # pyarrow and the normalisers load when the command runs, not for its usage errors
    from curator.mix.build import SourceReport
    from curator.mix.recipe import Recipe

SUMMARY_COLUMNS = ("source", "format", "quota", "read", "malformed", "filtered", "duplicates", "kept", "shortfall")


class _RichProgress:
    """Draws one progress line per source: rows read, then the kept count against the quota."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.tasks: dict[str, TaskID] = {}

    def source_started(self, name: str, quota: int) -> None:
        self.tasks[name] = self.bar.add_task(f"{name}: reading", total=None)

    def rows_read(self, name: str, read: int) -> None:
        self.bar.update(self.tasks[name], completed=read)

    def source_done(self, report: SourceReport) -> None:
        self.bar.update(
            self.tasks[report.name],
            description=f"{report.name}: kept {report.kept:,}/{report.quota:,}",
            total=max(report.read, 1),
            completed=max(report.read, 1),
        )


def build_mix_command(
    out: Path = typer.Option(..., "--out", help="Folder for part-*.parquet (and its manifest, .curator/manifest.json)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="Recipe YAML (see recipes/)."),
    from_catalog: bool = typer.Option(False, "--from-catalog", help="Build from the catalog's approved candidates."),
    target_samples: Optional[int] = typer.Option(
        None, "--target-samples", help="With --from-catalog: scale the approved sample counts to this total."
    ),
    name: str = typer.Option("catalog-mix", "--name", help="With --from-catalog: the mix's name."),
    seed: int = typer.Option(0, "--seed", help="With --from-catalog: the sampling seed."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Catalog file (default: $CURATOR_CATALOG or ./catalog.duckdb)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Target tokenizer folder, for --max-prompt-tokens."),
    max_prompt_tokens: Optional[int] = typer.Option(None, "--max-prompt-tokens", help="Drop prompts longer than this (target tokens)."),
    offline: bool = typer.Option(False, "--offline", help="No network: read Hub sources from the local datasets cache (HF_HUB_OFFLINE=1)."),
) -> None:
    """Build a prompt mix: read, normalise, filter, dedup and sample each source to its quota."""
    from curator.catalog import Catalog
    from curator.mix.build import build_mix, licenses_from_catalog, recipe_from_catalog
    from curator.mix.recipe import load_recipe

    if offline:
        os.environ[OFFLINE_ENV] = "1"  # before the datasets library is imported, which reads it once
    if (recipe is None) == (not from_catalog):
        raise ConfigError("give exactly one of --recipe FILE or --from-catalog")
    if target_samples is not None and not from_catalog:
        raise ConfigError("--target-samples only applies with --from-catalog (set `samples:` in the recipe instead)")
    mix_recipe: Recipe
    if recipe is not None:
        mix_recipe = load_recipe(recipe)  # a bad recipe fails before any catalog file is created
        cat = Catalog.open(catalog)
    else:
        cat = Catalog.open(catalog)
        mix_recipe = recipe_from_catalog(cat.approved_candidates(), name=name, seed=seed, target_samples=target_samples)
    licenses = licenses_from_catalog(cat, mix_recipe) if mix_recipe.filters.licenses is not None else None
    with progress() as bar:
        manifest = build_mix(
            mix_recipe,
            out,
            tokenizer=tokenizer,
            max_prompt_tokens=max_prompt_tokens,
            licenses=licenses,
            progress=_RichProgress(bar),
        )
    mix_id = cat.record_mix(mix_recipe.name, out.resolve(), mix_recipe.model_dump(mode="json"), manifest)
    _render(manifest, out, mix_id)


def _render(manifest: dict, out: Path, mix_id: str) -> None:
    rows = [
        [s["name"], s["format"], *(s[c] for c in SUMMARY_COLUMNS[2:])] for s in manifest["sources"]
    ]
    total = manifest["total"]
    rows.append(["total", "", *(total[c] for c in SUMMARY_COLUMNS[2:])])
    stdout.print(rows_table(SUMMARY_COLUMNS, rows, title=f"mix {manifest['name']}"))
    for s in manifest["sources"]:
        if s["skipped"]:
            console.print(f"[yellow]skipped {escape(str(s['name']))}:[/] {escape(str(s['skipped']))}")
        if s["malformed_reasons"]:
            reasons = ", ".join(f"{k} ({v:,})" for k, v in s["malformed_reasons"].items())
            console.print(f"[yellow]malformed in {escape(str(s['name']))}:[/] {escape(reasons)}", highlight=False)
    if manifest["duplicates"]:
        stdout.print(
            rows_table(
                ("kept from", "dropped from", "exact", "near"),
                [(d["kept_source"], d["dropped_source"], d["exact"], d["near"]) for d in manifest["duplicates"]],
                title="duplicates by source pair",
            )
        )
    stdout.print(
        summary_table(
            "written",
            [("rows", manifest["rows"]), ("parts", len(manifest["parts"])), ("folder", str(out)), ("catalog mix id", mix_id)],
        )
    )


def register(app: typer.Typer) -> None:
    """Add `build-mix` to the CLI."""
    app.command("build-mix")(build_mix_command)
