"""Build a mix: read -> normalise -> filter -> sample -> decontaminate -> dedup -> write, source by source.

Sources are processed in recipe order, which is their priority: a row that duplicates a row
already kept from an earlier source is dropped and counted against that pair of sources. A row
that matches a prompt of the recipe's `decontaminate:` list (or the traffic's held-out split) never
enters the mix. The output is a mix folder as curator/rows/schema.py defines it (docs/mix.md),
built whole in a sibling folder and swapped in (curator/mix/publish.py); the same recipe gives the
same bytes. With `match`, the quotas follow a traffic profile and rows are chosen by importance
(curator/mix/match.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from curator.errors import ConfigError
from curator.mix import filters, publish
from curator.mix.decontam import DEFAULT_NEAR, HELDOUT_OWNER, Decontaminator, dedup_text, row_texts
from curator.mix.dedup import Deduper
from curator.rows.formats.conversation import MalformedRow, SkippedRow, to_prompt
from curator.rows.formats.fields import source_id
from curator.rows.formats.table import FORMATS, Normaliser, default_turns, resolve_format
from curator.rows.formats.tap import request_part
from curator.mix.match import (
    SELECTION,
    UNIFORM,
    MatchPlan,
    TrafficModel,
    category_split,
    largest_remainder,
    plan,
    shared_categories,
)
from curator.mix.online import require_hub
from curator.rows.readers import BrokenRow, Row, is_hub_id, open_source
from curator.mix.recipe import Recipe, SourceSpec, recipe_from_dict
from curator.mix.sample import row_key, walk
from curator.rows.schema import COLUMNS, MANIFEST_VERSION, MixWriter
from curator.mix.survey import MAX_REASONS, UNUSABLE, Examined, Survey, classify_prompt, importance_keys, survey
from curator.traffic.schema import Profile, load_profile
from training.io.diskspace import named_disk_full
from training.io.text import is_valid_unicode

_EXCLUDED_KEY = 1 << 65  # past every 64-bit sampling key: held-out rows are walked last, and skipped


@dataclass
class SourceReport:
    """What happened to one source's rows:
    read = malformed + filtered + decontaminated + duplicates + heldout + kept + unsampled.

    Only the rows the sample's walk reaches are examined (normalised, filtered, deduplicated), so
    malformed, filtered, decontaminated and duplicates count the `examined` rows, not every row read:
    a larger quota examines more rows and may find more. A surveyed source (traffic, tap, --match)
    was looked at whole: the rows its survey could not use are counted over the whole source (and
    are among the examined), as are its held-out rows.
    """

    name: str
    spec: SourceSpec
    format: str = "unknown"
    turns: str = "all"
    read: int = 0
    malformed: int = 0
    filtered: int = 0
    decontaminated: int = 0
    duplicates: int = 0
    heldout: int = 0
    kept: int = 0
    skipped: str | None = None
    quotas: dict[str, int] = field(default_factory=dict)  # category -> rows wanted (the recipe's, or matched)
    kept_by_category: Counter[str] = field(default_factory=Counter)
    malformed_reasons: Counter[str] = field(default_factory=Counter)
    filtered_reasons: Counter[str] = field(default_factory=Counter)
    duplicates_exact: int = 0
    duplicates_near: int = 0
    decontaminated_exact: int = 0
    decontaminated_near: int = 0
    with_tools: int = 0  # kept rows carrying structured tools or tool calls
    truncated: int = 0  # malformed rows where a cut-off file ends (the records before it are read)

    @property
    def quota(self) -> int:
        return sum(self.quotas.values()) if self.quotas else self.spec.samples

    @property
    def shortfall(self) -> int:
        return max(0, self.quota - self.kept)

    @property
    def examined(self) -> int:
        """Return the rows whose fate the sample decided (the rows the other counts are over)."""
        return self.malformed + self.filtered + self.decontaminated + self.duplicates + self.kept

    @property
    def unsampled(self) -> int:
        return (self.read - self.malformed - self.filtered - self.decontaminated - self.duplicates - self.heldout
                - self.kept)

    def malformed_reason(self, reason: str) -> None:
        """Count one malformed row under its reason (distinct reasons capped, the rest under 'other')."""
        self.malformed += 1
        if reason.startswith("truncated:"):
            self.truncated += 1
        key = reason if reason in self.malformed_reasons or len(self.malformed_reasons) < MAX_REASONS else "other"
        self.malformed_reasons[key] += 1

    def filtered_reason(self, reason: str) -> None:
        """Count one filtered row under its reason."""
        self.filtered += 1
        self.filtered_reasons[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        """Return the manifest entry for this source."""
        spec = self.spec
        return {
            "name": self.name,
            "dataset": spec.dataset,
            "path": spec.path,
            "config": spec.config,
            "split": spec.split if spec.dataset is not None else None,
            "format": self.format,
            "category": "(classified)" if spec.is_traffic else spec.category,
            "turns": self.turns,
            "keep_responses": spec.keeps_responses,
            "license": spec.license,
            "recipe_quota": spec.samples,
            "quota": self.quota,
            "read": self.read,
            "examined": self.examined,
            "malformed": self.malformed,
            "filtered": self.filtered,
            "decontaminated": self.decontaminated,
            "duplicates": self.duplicates,
            "heldout": self.heldout,
            "kept": self.kept,
            "shortfall": self.shortfall,
            "unsampled": self.unsampled,
            "skipped": self.skipped,
            "categories": {c: {"quota": q, "kept": self.kept_by_category.get(c, 0)} for c, q in sorted(self.quotas.items())},
            "malformed_reasons": dict(sorted(self.malformed_reasons.items())),
            "filtered_reasons": dict(sorted(self.filtered_reasons.items())),
            "duplicates_exact": self.duplicates_exact,
            "duplicates_near": self.duplicates_near,
            "decontaminated_exact": self.decontaminated_exact,
            "decontaminated_near": self.decontaminated_near,
            "with_tools": self.with_tools,
            "truncated": self.truncated,
        }


class MixProgress(Protocol):
    """Receives progress while a mix builds (the CLI draws it with rich)."""

    def source_started(self, name: str, quota: int) -> None: ...

    def rows_read(self, name: str, read: int) -> None: ...

    def source_done(self, report: SourceReport) -> None: ...


def _turns(spec: SourceSpec, fmt: str) -> str:
    """Return a source's turn policy: the recipe's, else its format's."""
    return spec.turns or default_turns(fmt)


def _examiner(spec: SourceSpec, report: SourceReport, where: str, max_chars: int | None) -> Callable[..., Examined]:
    """Return examine(index, row, light=False): the row normalised and checked. A light look (the
    survey's) only normalises: a row it passes that a full look drops is dropped when walked."""
    normalise: Normaliser | None = None

    def examine(index: int, row: Row, light: bool = False) -> Examined:
        nonlocal normalise
        if isinstance(row, BrokenRow):
            return Examined(None, "malformed", row.reason)
        if normalise is None:
            report.format = resolve_format(spec.format, row.keys(), where)
            report.turns = _turns(spec, report.format)
            normalise = FORMATS[report.format].normaliser(spec.keeps_responses)
        try:
            prompt = to_prompt(normalise(row), report.turns, spec.keeps_responses)
        except MalformedRow as exc:
            return Examined(None, "malformed", str(exc))
        except SkippedRow as exc:  # a tap record that is no whole chat exchange
            return Examined(None, "filtered", str(exc))
        if light:
            return Examined(prompt)
        own_id = source_id(row)
        if not all(is_valid_unicode(content) for _, content in prompt):
            return Examined(None, "malformed", "text is not valid Unicode (lone surrogate)")
        reason = filters.cheap_filter(prompt, max_chars)
        if reason is not None:
            return Examined(None, "filtered", reason)
        return Examined(prompt, source_id=own_id, category=None if spec.is_traffic else spec.category)

    return examine


@dataclass
class _Context:
    """What every source's sampling shares: the dedup and decontamination state, the filters, the seed."""

    recipe: Recipe
    deduper: Deduper
    contam: Decontaminator
    pairs: Counter[tuple[int, int, str]]
    counter: filters.TokenCounter | None
    max_tokens: int | None
    root: Path | None
    progress: MixProgress | None
    model: TrafficModel | None  # under --match with features: the traffic's feature distributions


class _SourceRun:
    """One source's sampling: its walk order, the rows decided so far, and fills up to its quotas.

    A fill walks the source in key order (seeded random, or Gumbel top-k on importance under --match)
    and keeps rows until every category quota of the source is met or the rows run out. A later
    fill (a remainder handed over from a short source) walks again and passes over the rows already
    decided.
    """

    def __init__(self, idx: int, spec: SourceSpec, ctx: _Context, license: str | None) -> None:
        recipe = ctx.recipe
        self.idx, self.spec, self.ctx = idx, spec, ctx
        self.name = spec.label()
        self.report = SourceReport(name=self.name, spec=spec)
        if spec.format != "auto":
            self.report.format = resolve_format(spec.format, (), self.name)
            self.report.turns = _turns(spec, self.report.format)
        self.report.skipped = filters.license_refusal(license, recipe.filters.licenses)
        self.open_rows = open_source(spec, recipe.base_dir, recipe.seed, ctx.root)
        self.examine = _examiner(spec, self.report, f"source {self.name!r}", recipe.filters.max_prompt_chars)
        self.found: Survey | None = None
        self.keys: np.ndarray | None = None
        self.decided: set[int] = set()
        self.exhausted = self.report.skipped is not None
        self._read_counted = False

    def _on_read(self, n: int) -> None:
        self.report.read = n
        if self.ctx.progress is not None:
            self.ctx.progress.rows_read(self.name, n)

    def prepare(self) -> None:
        """Survey the source when its sample depends on every row (a traffic source; --match with features)."""
        if self.report.skipped or not (self.spec.is_traffic or self.ctx.model is not None):
            return
        model, seed = self.ctx.model, self.ctx.recipe.seed
        self.found = survey(self.open_rows(), self.examine, self.spec, seed, model.buckets if model else None,
                            self._on_read)
        self._read_counted = True
        self.report.heldout = int(self.found.excluded.sum())
        # The survey looked at every row: what it could not use is counted here, over the whole source,
        # and passed over by the walk (a tap log's error statuses are its statuses, not the sample's).
        for (drop, reason), n in sorted(self.found.unusable.items()):
            if drop == "filtered":
                self.report.filtered += n
                self.report.filtered_reasons[reason] += n
            else:
                self.report.malformed += n
                self.report.malformed_reasons[reason] += n
        if model is not None:
            self.keys = importance_keys(self.found, model, seed, self.name)

    def recipe_cells(self) -> dict[str, int]:
        """Return the recipe's rows for this source per category (a traffic source: split by its own shares)."""
        if self.spec.is_traffic:
            return category_split(self.found.counts(), self.spec.samples) if self.found is not None else {}
        return {self.spec.category: self.spec.samples}

    def heldout_rows(self) -> Iterator[tuple[int, Examined]]:
        """Yield (index, examined row) for the held-out rows, in file order."""
        found = self.found
        if found is None or not found.excluded.any():
            return
        for index, row in enumerate(self.open_rows()):
            if index < found.read and found.excluded[index]:
                ex = self.examine(index, row)
                if ex.prompt is not None:  # a tapped answer stays out: a held-out row is the request eval asks
                    prompt = request_part(ex.prompt) if self.spec.is_tap else ex.prompt
                    yield index, Examined(prompt, source_id=ex.source_id, category=found.category(index))

    def _key(self) -> Callable[[int], Any]:
        seed, name, found = self.ctx.recipe.seed, self.name, self.found
        if self.keys is not None:
            keys = self.keys
            return lambda i: float(keys[i]) if i < keys.size else float("inf")
        if found is not None and found.excluded.any():
            excluded = found.excluded
            return lambda i: _EXCLUDED_KEY if i < excluded.size and excluded[i] else row_key(seed, name, i)
        return lambda i: row_key(seed, name, i)

    def _examine(self, index: int, row: object) -> Examined:
        found = self.found
        if found is not None and index < found.read:
            if found.excluded[index]:
                return Examined(None, "heldout")
            if found.codes[index] == UNUSABLE:
                return Examined(None, "surveyed")  # counted by prepare()
            ex = self.examine(index, row)
            if ex.prompt is not None and self.spec.is_traffic:
                return Examined(ex.prompt, source_id=ex.source_id, category=found.category(index))
            return ex
        ex = self.examine(index, row)
        if ex.prompt is not None and self.spec.is_traffic:  # a row the survey did not see
            asked = request_part(ex.prompt) if self.spec.is_tap else ex.prompt
            return Examined(ex.prompt, source_id=ex.source_id, category=classify_prompt(asked))
        return ex

    def _room(self, category: str | None) -> bool:
        return category is not None and self.report.kept_by_category[category] < self.report.quotas.get(category, 0)

    def _wanted(self) -> int:
        return sum(max(0, q - self.report.kept_by_category[c]) for c, q in self.report.quotas.items())

    def fill(self) -> list[tuple[int, Examined]]:
        """Keep rows until the quotas are met or the source runs out; return the rows kept now, in row order."""
        if self.report.skipped or not self._wanted():
            return []
        need = self._wanted()
        on_read = None if self._read_counted else self._on_read
        self._read_counted = True
        items = walk(self.open_rows, self._key(), self._examine, need + need // 5 + 64 + len(self.decided), on_read)
        kept: list[tuple[int, Examined]] = []
        while self._wanted():
            # Rows go through decontamination and dedup in chunks so that signatures are computed
            # together; rows of a chunk past the quota stay undecided ("unsampled").
            raw = list(islice(items, max(16, min(512, self._wanted()))))
            if not raw:
                self.exhausted = True
                break
            kept.extend(self._decide([(i, ex) for i, ex in raw if i not in self.decided]))
        return sorted(kept, key=lambda t: t[0])

    def _decide(self, chunk: list[tuple[int, Examined]]) -> list[tuple[int, Examined]]:
        ctx, report = self.ctx, self.report
        # the rows still in the running (a prompt, and room in their category), by position in the chunk
        prompts = {k: ex.prompt for k, (_, ex) in enumerate(chunk) if ex.prompt is not None and self._room(ex.category)}
        reasons = [filters.token_filter(prompts[k], ctx.counter, ctx.max_tokens) if k in prompts else None
                   for k in range(len(chunk))]
        passing = [k for k in prompts if reasons[k] is None]
        matches, wholes = ctx.contam.screen([prompts[k] for k in passing])
        contaminated = dict(zip(passing, matches))
        clean = [k for k in passing if contaminated[k] is None]
        # A row decontamination prepared is not normalised and sketched again.
        prepared = {k: ctx.deduper.adopt(w) for k, w in zip(passing, wholes) if w is not None and contaminated[k] is None}
        fresh = [k for k in clean if k not in prepared]
        prepared.update(zip(fresh, ctx.deduper.prepare([dedup_text(prompts[k]) for k in fresh])))
        kept: list[tuple[int, Examined]] = []
        for k, (index, ex) in enumerate(chunk):
            if not self._wanted():
                break
            if ex.drop in ("heldout", "surveyed"):
                self.decided.add(index)  # counted by the survey
                continue
            if ex.drop == "malformed":
                report.malformed_reason(ex.reason or "malformed")
            elif ex.drop == "filtered" or reasons[k] is not None:
                report.filtered_reason(ex.reason or reasons[k] or "filtered")
            elif not self._room(ex.category):
                continue  # its category is full here: unsampled, and a later fill may take it
            elif (hit := contaminated[k]) is not None:
                ctx.contam.count(hit)
                report.decontaminated += 1
                if hit.kind == "exact":
                    report.decontaminated_exact += 1
                else:
                    report.decontaminated_near += 1
            elif (match := ctx.deduper.check(prepared[k], self.idx)) is not None:
                report.duplicates += 1
                if match.kind == "exact":
                    report.duplicates_exact += 1
                else:
                    report.duplicates_near += 1
                ctx.pairs[(match.owner, self.idx, match.kind)] += 1
            else:
                kept.append((index, ex))
                report.kept += 1
                report.kept_by_category[ex.category] += 1  # type: ignore[index]
                report.with_tools += int(ex.prompt.has_tools())  # type: ignore[union-attr]
            self.decided.add(index)
        return kept


def build_mix(
    recipe: Recipe,
    out_dir: str | Path,
    *,
    tokenizer: str | Path | None = None,
    max_prompt_tokens: int | None = None,
    licenses: Mapping[str, str | None] | None = None,
    progress: MixProgress | None = None,
    match: str | Path | None = None,
    allow_outside_paths: bool = False,
) -> dict[str, Any]:
    """Return the manifest of the mix built from `recipe` into `out_dir` (parquet parts + .curator/manifest.json).

    `match`: a traffic profile (PROFILE.json) whose category shares and features the mix follows.
    `allow_outside_paths`: let a recipe file's `path:` sources read outside its folder (the caller's
    permission, never the recipe's).
    """
    out = publish.real_out(out_dir)
    max_tokens = max_prompt_tokens if max_prompt_tokens is not None else recipe.filters.max_prompt_tokens
    if max_tokens is not None and tokenizer is None:
        raise ConfigError("max_prompt_tokens needs the target's tokenizer (build-mix --tokenizer PATH)")
    profile = load_profile(match) if match is not None else None
    serves = recipe.served_categories()
    if profile is not None:
        shared_categories(profile, serves, serves)
    root = None if allow_outside_paths else recipe.path_root
    everything = [*recipe.sources, *recipe.decontaminate]
    for spec in everything:  # inputs first: a missing file or an unreachable Hub leaves nothing behind
        open_source(spec, recipe.base_dir, recipe.seed, root)
    require_hub([spec.dataset for spec in everything if spec.dataset and is_hub_id(spec.dataset)])
    counter = filters.TokenCounter(tokenizer) if tokenizer is not None else None
    model = TrafficModel(profile, serves) if profile is not None and profile.features is not None else None
    ctx = _Context(recipe, Deduper(exact=recipe.dedup.exact, near=recipe.dedup.near), Decontaminator(recipe.dedup.near),
                   Counter(), counter, max_tokens, root, progress, model)
    with publish.staged(out) as stage, named_disk_full(out):  # the manifest's and the held-out split's writes too
        manifest = _build(ctx, stage, out, licenses, profile, match)
    return manifest


def _build(
    ctx: _Context,
    stage: Path,
    out: Path,
    licenses: Mapping[str, str | None] | None,
    profile: Profile | None,
    match: str | Path | None,
) -> dict[str, Any]:
    recipe, progress = ctx.recipe, ctx.progress
    for spec in recipe.decontaminate:
        ctx.contam.load(spec, recipe.base_dir, recipe.seed, ctx.root)
    runs = [_SourceRun(i, spec, ctx, spec.license or (licenses or {}).get(spec.dataset or "")) for i, spec in
            enumerate(recipe.sources)]
    for run in runs:
        if progress is not None:
            progress.source_started(run.name, run.spec.samples)
        run.prepare()
    heldout = next((_write_heldout(run, stage, out, ctx) for run in runs if run.report.heldout), None)
    cells = [(run.idx, cat, n) for run in runs for cat, n in run.recipe_cells().items()]
    matched: MatchPlan | None = None
    if profile is not None:
        matched = plan(profile, cells, recipe.total_samples(), SELECTION if ctx.model is not None else UNIFORM,
                       recipe.served_categories())
        for run in runs:
            run.report.quotas = dict(matched.quotas.get(run.idx, {}))
    else:
        for idx, cat, n in cells:
            runs[idx].report.quotas[cat] = n
    writer = MixWriter(stage, recipe.rows_per_part, named=out)

    def write(run: _SourceRun, rows: list[tuple[int, Examined]]) -> None:
        for index, ex in rows:
            writer.add(_mix_row(f"{run.name}:{index}", run, ex, run.spec.keeps_responses))

    for run in runs:
        write(run, run.fill())
        if progress is not None:
            progress.source_done(run.report)
    if matched is not None:
        _hand_over_remainders(runs, write, matched.keys)
        for run in runs:
            for cat, n in run.report.kept_by_category.items():
                matched.add_kept(cat, n)
    reports = [run.report for run in runs]
    refuse_empty(reports)
    parts = writer.finish()
    manifest = _manifest(recipe, reports, ctx, parts, heldout, matched, match)
    writer.publish(manifest)
    return manifest


def _hand_over_remainders(runs: Sequence[_SourceRun], write: Callable[[_SourceRun, list[tuple[int, Examined]]], None],
                          keys: Mapping[str, str] | None = None) -> None:
    """Give the remainder of each source that ran short to the sources that still have rows of a
    category serving the same traffic category (`keys`, recipe category -> match key: its own name
    where absent), in proportion to their quotas, until none is short or none has rows left."""
    def key(category: str) -> str:
        return (keys or {}).get(category, category)

    while True:
        moved = False
        for k in sorted({key(c) for run in runs for c in run.report.quotas}):
            cells = [(r, c) for r in runs for c in r.report.quotas if key(c) == k]
            short = [(r, c) for r, c in cells if r.exhausted and r.report.kept_by_category[c] < r.report.quotas[c]]
            takers = [(r, c) for r, c in cells if not r.exhausted]
            if not short or not takers:
                continue
            remainder = sum(r.report.quotas[c] - r.report.kept_by_category[c] for r, c in short)
            for r, c in short:
                r.report.quotas[c] = r.report.kept_by_category[c]
            for (r, c), extra in zip(takers, largest_remainder([max(1, r.report.quotas[c]) for r, c in takers], remainder)):
                r.report.quotas[c] += extra
            for r in dict.fromkeys(r for r, _ in takers):
                write(r, r.fill())
            moved = True
        if not moved:
            return


def _mix_row(row_id: str, run: _SourceRun, ex: Examined, keep_responses: bool) -> tuple[str, str, str, Any, str, bool, str | None]:
    """Return a kept row as MixWriter takes it. Every row kept has its prompt and its category: the
    examiner sets both, or the traffic classifier the category of a traffic source's rows."""
    assert ex.prompt is not None and ex.category is not None, f"{row_id} was kept without a prompt or category"
    return (row_id, run.name, ex.category, ex.prompt, run.report.turns, keep_responses, ex.source_id)


def _write_heldout(run: _SourceRun, stage: Path, out: Path, ctx: _Context) -> dict[str, Any]:
    """Write the traffic's held-out rows as a mix of their own (stage/.heldout) and keep them out of this one."""
    writer = MixWriter(stage / publish.HELDOUT_DIR, ctx.recipe.rows_per_part, named=out / publish.HELDOUT_DIR)
    texts: list[str] = []
    rows = 0
    for index, ex in run.heldout_rows():
        writer.add(_mix_row(f"{run.name}:{index}", run, ex, False))
        texts.extend(row_texts(ex.prompt))  # type: ignore[arg-type]
        rows += 1
    ctx.contam.add(HELDOUT_OWNER, texts)
    entry = {"folder": publish.HELDOUT_DIR, "source": run.name, "heldout": run.spec.heldout, "seed": ctx.recipe.seed,
             "conversations": run.found.heldout_conversations if run.found is not None else 0, "rows": rows}
    parts = writer.finish()
    # its own map, so that `curator eval --prompts MIX/.heldout` reads it where it reads the rows
    writer.publish({"manifest_version": MANIFEST_VERSION, "name": f"{ctx.recipe.name}-heldout", "rows": rows,
                    "columns": list(COLUMNS), "parts": parts, "heldout": entry,
                    "serves": ctx.recipe.served_categories()})
    return entry


def refuse_empty(reports: Sequence[SourceReport]) -> None:
    """Raise ConfigError, naming the sources and why, when the mix would be empty or a source had
    rows but every one was malformed (a wrong `format:` or a broken file, not a small quota)."""
    broken = [r for r in reports if r.read and r.malformed == r.read]
    if broken or not sum(r.kept for r in reports):
        why = "; ".join(f"{r.name}: {_why_nothing(r)}" for r in (broken or reports))
        what = "every row of a source is malformed" if broken else "the mix would be empty"
        raise ConfigError(f"{what}, so no mix was written: {why}")


def heldout_warnings(recipe: Recipe, manifest: Mapping[str, Any]) -> list[str]:
    """Return one line per traffic source that asked for `heldout:` and got no held-out row.

    Not a refusal: a source whose rows are all filtered (or held-out rows all dropped by the full
    filters) is content, not a broken file; only "every row of a source is malformed" (a wrong
    `format:`, refuse_empty) refuses. The rest of the mix is sound, but an eval of MIX/.heldout
    would find nothing, so the build says so instead of a silent exit 0.
    """
    held = manifest.get("heldout") or {}
    entries = {str(e.get("name")): e for e in manifest.get("sources") or []}
    lines = []
    for spec in recipe.sources:
        name = spec.label()
        if not spec.is_traffic or spec.heldout is None or (held.get("source") == name and held.get("rows")):
            continue
        entry = entries.get(name, {})
        why = [f"{entry.get('read', 0):,} read"]
        for what in ("malformed", "filtered"):
            if entry.get(what):
                reasons = ", ".join(f"{k}: {v:,}" for k, v in (entry.get(f"{what}_reasons") or {}).items())
                why.append(f"{entry[what]:,} {what}" + (f" ({reasons})" if reasons else ""))
        lines.append(f"source {name!r} asked for heldout: {spec.heldout} but has no usable row to hold out "
                     f"({', '.join(why)}): no {publish.HELDOUT_DIR} split was written for it")
    return lines


def _why_nothing(report: SourceReport) -> str:
    if report.skipped:
        return f"skipped ({report.skipped})"
    if not report.read:
        return "no rows"
    if not report.quota:
        return "quota 0 (the traffic has none of its category)"
    parts = [f"{report.read:,} read"]
    for what, count, reasons in (("malformed", report.malformed, report.malformed_reasons),
                                 ("filtered", report.filtered, report.filtered_reasons)):
        if count:
            parts.append(f"{count:,} {what} (" + ", ".join(f"{k}: {v:,}" for k, v in reasons.most_common(3)) + ")")
    for what, count in (("decontaminated", report.decontaminated), ("duplicates", report.duplicates),
                        ("held out", report.heldout)):
        if count:
            parts.append(f"{count:,} {what}")
    return ", ".join(parts)


def _manifest(
    recipe: Recipe,
    reports: list[SourceReport],
    ctx: _Context,
    parts: list[dict[str, Any]],
    heldout: dict[str, Any] | None,
    matched: MatchPlan | None,
    match: str | Path | None,
) -> dict[str, Any]:
    keys = ("quota", "read", "examined", "malformed", "filtered", "decontaminated", "duplicates", "heldout", "kept", "shortfall",
            "unsampled")
    sources = [r.to_dict() for r in reports]
    total = {k: sum(s[k] for s in sources) for k in keys}
    pairs = ctx.pairs
    dup_pairs = []
    for owner, dropped in sorted({(o, d) for o, d, _ in pairs}):
        dup_pairs.append(
            {
                "kept_source": reports[owner].name,
                "dropped_source": reports[dropped].name,
                "exact": pairs[(owner, dropped, "exact")],
                "near": pairs[(owner, dropped, "near")],
            }
        )
    return {
        "manifest_version": MANIFEST_VERSION,
        "name": recipe.name,
        "seed": recipe.seed,
        "rows": total["kept"],
        "total": total,
        "columns": list(COLUMNS),
        "parts": parts,
        "sources": sources,
        "duplicates": dup_pairs,
        "dedup": {"exact": recipe.dedup.exact, "near": recipe.dedup.near, "priority": [r.name for r in reports]},
        "decontaminate": {"near": ctx.contam.near if ctx.contam.near is not None else DEFAULT_NEAR,
                          "sets": [s.to_dict() for s in ctx.contam.sets]},
        "heldout": heldout,
        # {category: the traffic category it serves}: what `curator eval --profile` weights the rows' categories by
        "serves": recipe.served_categories(),
        "match": matched.to_dict(str(match)) if matched is not None else None,
        "filters": {
            "max_prompt_chars": recipe.filters.max_prompt_chars,
            "max_prompt_tokens": ctx.max_tokens,
            "licenses": recipe.filters.licenses,
        },
        "recipe": recipe.model_dump(mode="json"),
    }


def licenses_from_catalog(catalog: Any, recipe: Recipe) -> dict[str, str | None]:
    """Return the catalog's license for each Hub dataset of the recipe (None where unknown)."""
    out: dict[str, str | None] = {}
    for spec in recipe.sources:
        if spec.dataset is not None:
            row = catalog.dataset(spec.dataset)
            out[spec.dataset] = row.get("license") if row else None
    return out


def recipe_from_catalog(
    candidates: Sequence[Mapping[str, Any]],
    *,
    name: str = "catalog-mix",
    seed: int = 0,
    target_samples: int | None = None,
    near: float | None = 0.85,
    served: Mapping[str, str] | None = None,
) -> Recipe:
    """Return a recipe with one source per approved candidate (format auto, split train).

    With `target_samples`, the candidates' sample counts are scaled to sum to it exactly
    (largest remainders), keeping their proportions. `served` maps a candidate's category to the
    traffic category it serves (the briefs' `traffic:`, `curator.scout.traffic_shares.served_map`):
    a source whose category serves another one gets it as `traffic:`, for the mix to record.
    """
    usable = [c for c in candidates if c.get("dataset_id") and (c.get("samples") or 0) > 0]
    if not usable:
        raise ConfigError("the catalog has no approved candidates with a sample count; approve some first (curator catalog approve)")
    counts = [int(c["samples"]) for c in usable]
    if target_samples is not None:
        counts = _scale(counts, target_samples)
    sources = []
    for cand, n in zip(usable, counts):
        if n <= 0:
            continue
        src: dict[str, Any] = {"dataset": cand["dataset_id"], "samples": n, "category": cand.get("category") or "general"}
        traffic = (served or {}).get(src["category"])
        if traffic is not None and traffic != src["category"]:
            src["traffic"] = traffic
        for key in ("config", "split", "format", "turns", "keep_responses"):
            if cand.get(key) is not None:
                src[key] = cand[key]
        if cand.get("license"):
            src["license"] = cand["license"]
        sources.append(src)
    data = {"name": name, "seed": seed, "sources": sources, "dedup": {"exact": True, "near": near if near is not None else False}}
    return recipe_from_dict(data, "catalog")


def _scale(counts: list[int], target: int) -> list[int]:
    if target <= 0:
        raise ConfigError(f"--target-samples must be positive (got {target})")
    return largest_remainder(counts, target)
