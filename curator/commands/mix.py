"""`curator build-mix`: build a prompt mix from a recipe or from the catalog's approved candidates."""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.progress import Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from curator.errors import ConfigError
from curator.mix.online import OFFLINE_ENV
from curator.ui import console, format_value, progress, stdout, summary_table

if TYPE_CHECKING:  # pyarrow and the normalisers load when the command runs, not for its usage errors
    from curator.mix.build import SourceReport
    from curator.catalog import Catalog
    from curator.mix.recipe import Recipe

SUMMARY_COLUMNS = ("source", "format", "category", "quota", "read", "examined", "malformed", "filtered", "decontaminated",
                   "duplicates", "held out", "kept", "shortfall")
_MANIFEST_KEYS = {"held out": "heldout"}


class _RichProgress:
    """Draws one progress line per source: rows read, then the kept count against the quota."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.tasks: dict[str, TaskID] = {}

    def source_started(self, name: str, quota: int) -> None:
        self.tasks[name] = self.bar.add_task(escape(name), total=None, status="reading")  # names are data, not markup

    def rows_read(self, name: str, read: int) -> None:
        self.bar.update(self.tasks[name], completed=read)

    def source_done(self, report: SourceReport) -> None:
        self.bar.update(
            self.tasks[report.name],
            status=f"kept {report.kept:,}/{report.quota:,}",
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
    catalog: Optional[Path] = typer.Option(
        None, "--catalog", help="Catalog file to record the mix in (default: $CURATOR_CATALOG, else ./catalog.duckdb "
                                "where one exists: none is created unasked)."
    ),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Target tokenizer folder, for --max-prompt-tokens."),
    max_prompt_tokens: Optional[int] = typer.Option(None, "--max-prompt-tokens", help="Drop prompts longer than this (target tokens)."),
    offline: bool = typer.Option(False, "--offline", help="No network: read Hub sources from the local datasets cache (HF_HUB_OFFLINE=1)."),
    match: Optional[Path] = typer.Option(
        None, "--match", help="Traffic profile (curator profile): category shares and traffic-like rows follow it."
    ),
    allow_outside_paths: bool = typer.Option(
        False, "--allow-outside-paths", help="Let the recipe's path: sources, local dataset: builders and data_files read outside the recipe's folder."
    ),
) -> None:
    """Build a prompt mix: read, normalise, filter, dedup and sample each source to its quota."""
    from curator.catalog import Catalog
    from curator.mix.build import heldout_warnings, licenses_from_catalog, recipe_from_catalog
    from curator.mix.recipe import load_recipe
    from curator.stages import CatalogRef, build_and_record_mix

    if offline:
        os.environ[OFFLINE_ENV] = "1"  # before the datasets library is imported, which reads it once
    if (recipe is None) == (not from_catalog):
        raise ConfigError("give exactly one of --recipe FILE or --from-catalog")
    if target_samples is not None and not from_catalog:
        raise ConfigError("--target-samples only applies with --from-catalog (set `samples:` in the recipe instead)")
    mix_recipe: Recipe
    cat: CatalogRef = catalog  # opened after the build, unless the build needs it: then its failure is an error
    if recipe is not None:
        mix_recipe = load_recipe(recipe)  # a bad recipe fails before any catalog file is created
    else:
        cat = _existing_catalog(catalog, "--from-catalog builds from its approved candidates")
        mix_recipe = recipe_from_catalog(cat.approved_candidates(), name=name, seed=seed, target_samples=target_samples,
                                         served=_brief_traffic())
    licenses = None
    if mix_recipe.filters.licenses is not None:  # the license filter reads the datasets' licenses from the catalog
        cat = cat if isinstance(cat, Catalog) else _existing_catalog(catalog, "the recipe's license filter reads "
                                                                               "the datasets' licenses from it")
        licenses = licenses_from_catalog(cat, mix_recipe)
    with progress(TextColumn("{task.fields[status]}")) as bar:
        recorded = build_and_record_mix(
            mix_recipe,
            out,
            cat,
            tokenizer=tokenizer,
            max_prompt_tokens=max_prompt_tokens,
            licenses=licenses,
            progress=_RichProgress(bar),
            match=match,
            allow_outside_paths=allow_outside_paths,
        )
    _render(recorded.result, out, recorded.catalog_id or (f"not recorded: {recorded.note}" if recorded.note else None))
    for line in heldout_warnings(mix_recipe, recorded.result):
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    if recorded.warning:  # the mix is complete on disk: a catalog failure is a warning, exit 0
        console.print(f"[yellow]warning:[/] {escape(recorded.warning)}")


def _existing_catalog(catalog: Optional[Path], why: str) -> Catalog:
    """Return the catalog a build needs before it starts; CatalogError, creating nothing, where there is none."""
    from curator.catalog import Catalog, resolve_path
    from curator.errors import CatalogError

    path = resolve_path(catalog)
    if not path.exists():
        raise CatalogError(f"no catalog at {path} ({why}): run `curator scout` first, or pass --catalog FILE")
    return Catalog.open(path)


def _brief_traffic() -> dict[str, str]:
    """Return {brief category: traffic category} from the briefs folder ($CURATOR_AGENTS_DIR or ./agents),
    so that a catalog mix of brief categories records what each serves; empty without briefs (a
    category named as a traffic category still serves itself)."""
    from curator.scout.briefs import default_agents_dir, load_briefs
    from curator.scout.traffic_shares import served_map

    root = default_agents_dir()
    if not root.is_dir() or not any(root.glob("*.md")):
        return {}
    return served_map(load_briefs(root))  # a broken brief is an error, not a silently empty map


class Records:
    """Rows as a table when it fits the terminal, else one block per row (as psql's expanded display):
    at any width, no name, value or header is cut."""

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str) -> None:
        self.columns = list(columns)
        self.cells = [[format_value(v) for v in row] for row in rows]
        self.title = title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [max([len(c)] + [len(row[i]) for row in self.cells]) for i, c in enumerate(self.columns)]
        if sum(widths) + 3 * len(widths) + 1 <= options.max_width:
            table = Table(title=Text(self.title), title_justify="left")
            for i, name in enumerate(self.columns):
                table.add_column(name, no_wrap=True, justify="left" if i == 0 else "right")
            for row in self.cells:
                table.add_row(*(Text(cell) for cell in row))  # cells are data, never markup
            yield table
            return
        yield Text(self.title, style="bold")
        for row in self.cells:
            yield Text(f"{self.columns[0]}: {row[0]}", style="bold")
            line = " "
            for name, cell in zip(self.columns[1:], row[1:]):
                pair = f" {name} {cell}" if cell else ""
                if len(line) + len(pair) > options.max_width and line.strip():
                    yield Text(line)
                    line = " "
                line += pair
            if line.strip():
                yield Text(line)


def summary_rows(manifest: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Return the build table's columns and rows (a source per row, then the total); held out only when used."""
    # a manifest written before `examined` was recorded has none: its column stays out
    columns = [c for c in SUMMARY_COLUMNS if (c != "held out" or manifest["total"].get("heldout"))
               and (c != "examined" or "examined" in manifest["total"])]
    rows = []
    for s in [*manifest["sources"], {**manifest["total"], "name": "total", "format": "", "category": ""}]:
        rows.append([s["name"], *(s.get(_MANIFEST_KEYS.get(c, c)) for c in columns[1:])])
    return columns, rows


def _render(manifest: dict, out: Path, mix_id: str | None) -> None:
    columns, rows = summary_rows(manifest)
    stdout.print(Records(columns, rows, f"mix {manifest['name']}"))
    partly = [s for s in manifest["sources"] if s.get("unsampled") and "examined" in s]
    if partly:
        stdout.print(Text(f"malformed, filtered, decontaminated and duplicates count the rows examined to fill the "
                          f"quotas, not every row read: {_examined(partly)}; another quota examines other rows."))
    for s in manifest["sources"]:
        if s["skipped"]:
            console.print(f"[yellow]skipped {escape(str(s['name']))}:[/] {escape(str(s['skipped']))}")
        of = f" (of {s['examined']:,} examined)" if s.get("unsampled") and "examined" in s else ""
        for what in ("malformed", "filtered"):
            if s.get(f"{what}_reasons"):
                reasons = ", ".join(f"{k} ({v:,})" for k, v in s[f"{what}_reasons"].items())
                console.print(f"[yellow]{what} in {escape(str(s['name']))}{of}:[/] {escape(reasons)}", highlight=False)
    if manifest["duplicates"]:
        stdout.print(Records(("kept from", "dropped from", "exact", "near"),
                             [(d["kept_source"], d["dropped_source"], d["exact"], d["near"]) for d in manifest["duplicates"]],
                             "duplicates by source pair"))
    decontaminate = manifest.get("decontaminate") or {}
    if decontaminate.get("sets"):
        stdout.print(Records(("decontamination set", "prompts", "malformed", "mix rows dropped"),
                             [(d["name"], d["prompts"], d["malformed"], d["mix_rows_dropped"]) for d in decontaminate["sets"]],
                             f"decontamination (exact, and near at Jaccard {decontaminate['near']})"))
    if manifest.get("match"):
        _render_match(manifest["match"])
    written = [("rows", manifest["rows"]), ("parts", len(manifest["parts"])), ("folder", str(out)),
               ("catalog mix id", mix_id or "not recorded")]
    if manifest.get("heldout"):
        held = manifest["heldout"]
        written.append(("held-out split", f"{out / held['folder']} ({held['rows']:,} rows, {held['conversations']:,} conversations)"))
    stdout.print(summary_table("written", written))


def _examined(sources: Sequence[dict[str, Any]]) -> str:
    shown = [f"{s['name']} {s['examined']:,} of {s['read']:,}" for s in sources[:3]]
    return ", ".join(shown) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")


def _render_match(match: dict[str, Any]) -> None:
    rows = [(cat, _pct(c["traffic_share"]), _pct(c["target_share"]), c["target"], c["kept"], _pct(c["achieved_share"]))
            for cat, c in match["categories"].items()]
    stdout.print(Records(("category", "traffic", "target share", "target", "kept", "achieved"), rows,
                         f"matched to {match['profile']} ({match['method']})"))
    if match["not_in_recipe"]:
        missing = ", ".join(f"{c} ({_pct(s)})" for c, s in match["not_in_recipe"].items())
        console.print(f"[yellow]traffic the recipe has no source for:[/] {escape(missing)}", highlight=False)
    if match["not_in_traffic"]:
        console.print(f"[yellow]recipe categories absent from the traffic (no rows):[/] "
                      f"{escape(', '.join(match['not_in_traffic']))}", highlight=False)


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def register(app: typer.Typer) -> None:
    """Add `build-mix` to the CLI."""
    app.command("build-mix")(build_mix_command)
