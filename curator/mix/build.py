"""Build a mix: read -> normalise -> filter -> sample -> dedup -> write, source by source.

Sources are processed in recipe order, which is their priority: a row that duplicates a row
already kept from an earlier source is dropped and counted against that pair of sources.
The output is a mix folder as curator/mix/schema.py defines it (docs/mix.md): parquet parts and
.curator/manifest.json, published whole; the same recipe gives the same bytes. One build at a time writes a
folder, and a build first removes what a killed one left there.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from curator.errors import ConfigError
from curator.mix import filters
from curator.mix.dedup import Deduper
from curator.mix.formats import NORMALISERS, Conversation, MalformedRow, default_turns, resolve_format, to_prompt
from curator.mix.online import require_hub
from curator.mix.readers import BrokenRow, open_source
from curator.mix.recipe import Recipe, SourceSpec, recipe_from_dict
from curator.mix.sample import row_key, walk
from curator.mix.schema import COLUMNS, MANIFEST_VERSION, MixWriter, mix_lock, remove_stale_files
from training.outlock import OutputBusyError
from training.text import is_valid_unicode

_MAX_REASONS = 20


@dataclass
class SourceReport:
    """What happened to one source's rows: read = malformed + filtered + duplicates + kept + unsampled."""

    name: str
    spec: SourceSpec
    format: str = "unknown"
    turns: str = "all"
    read: int = 0
    malformed: int = 0
    filtered: int = 0
    duplicates: int = 0
    kept: int = 0
    skipped: str | None = None
    malformed_reasons: Counter[str] = field(default_factory=Counter)
    filtered_reasons: Counter[str] = field(default_factory=Counter)
    duplicates_exact: int = 0
    duplicates_near: int = 0
    with_tools: int = 0  # kept rows carrying structured tools or tool calls

    @property
    def quota(self) -> int:
        return self.spec.samples

    @property
    def shortfall(self) -> int:
        return max(0, self.quota - self.kept)

    @property
    def unsampled(self) -> int:
        return self.read - self.malformed - self.filtered - self.duplicates - self.kept

    def malformed_reason(self, reason: str) -> None:
        """Count one malformed row under its reason (distinct reasons capped, the rest under 'other')."""
        self.malformed += 1
        key = reason if reason in self.malformed_reasons or len(self.malformed_reasons) < _MAX_REASONS else "other"
        self.malformed_reasons[key] += 1

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
            "category": spec.category,
            "turns": self.turns,
            "keep_responses": spec.keep_responses,
            "license": spec.license,
            "quota": self.quota,
            "read": self.read,
            "malformed": self.malformed,
            "filtered": self.filtered,
            "duplicates": self.duplicates,
            "kept": self.kept,
            "shortfall": self.shortfall,
            "unsampled": self.unsampled,
            "skipped": self.skipped,
            "malformed_reasons": dict(sorted(self.malformed_reasons.items())),
            "filtered_reasons": dict(sorted(self.filtered_reasons.items())),
            "duplicates_exact": self.duplicates_exact,
            "duplicates_near": self.duplicates_near,
            "with_tools": self.with_tools,
        }


class MixProgress(Protocol):
    """Receives progress while a mix builds (the CLI draws it with rich)."""

    def source_started(self, name: str, quota: int) -> None: ...

    def rows_read(self, name: str, read: int) -> None: ...

    def source_done(self, report: SourceReport) -> None: ...


@dataclass(frozen=True)
class _Examined:
    prompt: Conversation | None
    drop: str | None = None  # "malformed" | "filtered"
    reason: str | None = None


def dedup_text(prompt: Conversation) -> str:
    """Return the text dedup compares: the user and tool turns (system prompts are often shared boilerplate)."""
    return "\n".join(content for role, content in prompt if role in ("user", "tool"))


def _examiner(spec: SourceSpec, report: SourceReport, where: str, max_chars: int | None):
    normalise = None

    def examine(index: int, row: object) -> _Examined:
        nonlocal normalise
        if isinstance(row, BrokenRow):
            return _Examined(None, "malformed", row.reason)
        if normalise is None:
            report.format = resolve_format(spec.format, row.keys(), where)  # type: ignore[union-attr]
            report.turns = spec.turns or default_turns(report.format)
            normalise = NORMALISERS[report.format]
        try:
            prompt = to_prompt(normalise(row), report.turns, spec.keep_responses)  # type: ignore[arg-type]
        except MalformedRow as exc:
            return _Examined(None, "malformed", str(exc))
        if not all(is_valid_unicode(content) for _, content in prompt):
            return _Examined(None, "malformed", "text is not valid Unicode (lone surrogate)")
        reason = filters.cheap_filter(prompt, max_chars)
        if reason is not None:
            return _Examined(None, "filtered", reason)
        return _Examined(prompt)

    return examine


def _build_source(
    idx: int,
    spec: SourceSpec,
    recipe: Recipe,
    deduper: Deduper,
    pairs: Counter[tuple[int, int, str]],
    counter: filters.TokenCounter | None,
    max_tokens: int | None,
    license: str | None,
    progress: MixProgress | None,
) -> tuple[SourceReport, list[tuple[int, Conversation]]]:
    name = spec.label()
    report = SourceReport(name=name, spec=spec)
    if spec.format != "auto":
        report.format = resolve_format(spec.format, (), name)
        report.turns = spec.turns or default_turns(report.format)
    refusal = filters.license_refusal(license, recipe.filters.licenses)
    if refusal is not None:
        report.skipped = refusal
        return report, []
    open_rows = open_source(spec, recipe.base_dir, recipe.seed, recipe.path_root)
    examine = _examiner(spec, report, f"source {name!r}", recipe.filters.max_prompt_chars)

    def on_read(n: int) -> None:
        report.read = n
        if progress is not None:
            progress.rows_read(name, n)

    kept: list[tuple[int, Conversation]] = []
    capacity = spec.samples + spec.samples // 5 + 64
    items = walk(open_rows, lambda i: row_key(recipe.seed, name, i), examine, capacity, on_read)
    while report.kept < spec.samples:
        # Rows go through dedup in chunks so that signatures are computed together; rows of
        # a chunk past the quota are not counted (they stay "unsampled").
        chunk = list(islice(items, max(16, min(512, spec.samples - report.kept))))
        if not chunk:
            break
        reasons = [
            filters.token_filter(ex.prompt, counter, max_tokens) if ex.prompt is not None else None for _, ex in chunk
        ]
        passing = [i for i, (_, ex) in enumerate(chunk) if ex.prompt is not None and reasons[i] is None]
        prepared = dict(zip(passing, deduper.prepare([dedup_text(chunk[i][1].prompt) for i in passing])))
        for i, (index, ex) in enumerate(chunk):
            if report.kept >= spec.samples:
                break
            if ex.drop == "malformed":
                report.malformed_reason(ex.reason or "malformed")
            elif ex.drop == "filtered" or reasons[i] is not None:
                report.filtered += 1
                report.filtered_reasons[ex.reason or reasons[i] or "filtered"] += 1
            elif (match := deduper.check(prepared[i], idx)) is not None:
                report.duplicates += 1
                if match.kind == "exact":
                    report.duplicates_exact += 1
                else:
                    report.duplicates_near += 1
                pairs[(match.owner, idx, match.kind)] += 1
            else:
                kept.append((index, ex.prompt))
                report.kept += 1
                report.with_tools += int(ex.prompt.has_tools())
    # The first pass always reads the whole source (bottom-k needs every key), so `read`
    # is the source's full size or its scan limit even when the quota was met early.
    return report, sorted(kept, key=lambda t: t[0])


def build_mix(
    recipe: Recipe,
    out_dir: str | Path,
    *,
    tokenizer: str | Path | None = None,
    max_prompt_tokens: int | None = None,
    licenses: Mapping[str, str | None] | None = None,
    progress: MixProgress | None = None,
) -> dict[str, Any]:
    """Return the manifest of the mix built from `recipe` into `out_dir` (parquet parts + .curator/manifest.json)."""
    out = Path(out_dir)
    max_tokens = max_prompt_tokens if max_prompt_tokens is not None else recipe.filters.max_prompt_tokens
    if max_tokens is not None and tokenizer is None:
        raise ConfigError("max_prompt_tokens needs the target's tokenizer (build-mix --tokenizer PATH)")
    counter = filters.TokenCounter(tokenizer) if tokenizer is not None else None
    for spec in recipe.sources:  # inputs first: a missing file or an unreachable Hub leaves no folder behind
        open_source(spec, recipe.base_dir, recipe.seed)
    require_hub([spec.dataset for spec in recipe.sources if spec.dataset])
    created = not out.exists()
    try:
        lock = mix_lock(out).acquire()
    except OutputBusyError as exc:
        raise ConfigError(str(exc)) from None
    try:
        remove_stale_files(out)
        return _build(recipe, out, counter, max_tokens, licenses, progress)
    except BaseException:
        if created and not any(out.glob("part-*.parquet")):
            shutil.rmtree(out, ignore_errors=True)  # a failed first build leaves no folder
        raise
    finally:
        lock.release()


def _build(
    recipe: Recipe,
    out: Path,
    counter: filters.TokenCounter | None,
    max_tokens: int | None,
    licenses: Mapping[str, str | None] | None,
    progress: MixProgress | None,
) -> dict[str, Any]:
    deduper = Deduper(exact=recipe.dedup.exact, near=recipe.dedup.near)
    pairs: Counter[tuple[int, int, str]] = Counter()
    writer = MixWriter(out, recipe.rows_per_part)
    reports: list[SourceReport] = []
    try:
        for idx, spec in enumerate(recipe.sources):
            if progress is not None:
                progress.source_started(spec.label(), spec.samples)
            license = spec.license or (licenses or {}).get(spec.dataset or "")
            report, kept = _build_source(idx, spec, recipe, deduper, pairs, counter, max_tokens, license, progress)
            for index, prompt in kept:
                writer.add((f"{report.name}:{index}", report.name, spec.category, prompt, report.turns, spec.keep_responses))
            reports.append(report)
            if progress is not None:
                progress.source_done(report)
        refuse_empty(reports)
        parts = writer.finish()
        manifest = _manifest(recipe, reports, pairs, parts, max_tokens)
        writer.publish(manifest)
    except BaseException:
        writer.abort()
        raise
    return manifest


def refuse_empty(reports: Sequence[SourceReport]) -> None:
    """Raise ConfigError, naming the sources and why, when the mix would be empty or a source had
    rows but every one was malformed (a wrong `format:` or a broken file, not a small quota)."""
    broken = [r for r in reports if r.read and r.malformed == r.read]
    if broken or not sum(r.kept for r in reports):
        why = "; ".join(f"{r.name}: {_why_nothing(r)}" for r in (broken or reports))
        what = "every row of a source is malformed" if broken else "the mix would be empty"
        raise ConfigError(f"{what}, so no mix was written: {why}")


def _why_nothing(report: SourceReport) -> str:
    if report.skipped:
        return f"skipped ({report.skipped})"
    if not report.read:
        return "no rows"
    parts = [f"{report.read:,} read"]
    for what, count, reasons in (("malformed", report.malformed, report.malformed_reasons),
                                 ("filtered", report.filtered, report.filtered_reasons)):
        if count:
            parts.append(f"{count:,} {what} (" + ", ".join(f"{k}: {v:,}" for k, v in reasons.most_common(3)) + ")")
    if report.duplicates:
        parts.append(f"{report.duplicates:,} duplicates")
    return ", ".join(parts)


def _manifest(
    recipe: Recipe,
    reports: list[SourceReport],
    pairs: Counter[tuple[int, int, str]],
    parts: list[dict[str, Any]],
    max_tokens: int | None,
) -> dict[str, Any]:
    keys = ("quota", "read", "malformed", "filtered", "duplicates", "kept", "shortfall", "unsampled")
    sources = [r.to_dict() for r in reports]
    total = {k: sum(s[k] for s in sources) for k in keys}
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
        "filters": {
            "max_prompt_chars": recipe.filters.max_prompt_chars,
            "max_prompt_tokens": max_tokens,
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
) -> Recipe:
    """Return a recipe with one source per approved candidate (format auto, split train).

    With `target_samples`, the candidates' sample counts are scaled to sum to it exactly
    (largest remainders), keeping their proportions.
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
    total = sum(counts)
    exact = [c * target / total for c in counts]
    out = [int(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: target - sum(out)]:
        out[i] += 1
    return out
