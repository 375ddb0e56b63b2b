"""Build a mix: read -> normalise -> filter -> sample -> dedup -> write, source by source.

Sources are processed in recipe order, which is their priority: a row that duplicates a row
already kept from an earlier source is dropped and counted against that pair of sources.
The output is DIR/part-NNNNN.parquet plus DIR/manifest.json (CONTRACTS §1); the same recipe
gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from curator.errors import ConfigError
from curator.mix import filters
from curator.mix.dedup import Deduper
from curator.mix.formats import NORMALISERS, Conversation, MalformedRow, default_turns, resolve_format, to_prompt
from curator.mix.readers import BrokenRow, open_source
from curator.mix.recipe import Recipe, SourceSpec, recipe_from_dict
from curator.mix.sample import row_key, walk
from training.atomic import write_text

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_MAX_REASONS = 20

TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("type", pa.string()),
                            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
                          ("tool_call_id", pa.string()), ("name", pa.string())])
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("category", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("turns", pa.string()),
        ("keep_responses", pa.bool_()),
        ("tools", pa.string()),  # JSON list of the tools offered (OpenAI shape), null when none
    ]
)


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


class _PartWriter:
    """Writes rows into part files under temporary names; `commit` renames them into place."""

    def __init__(self, out_dir: Path, rows_per_part: int) -> None:
        self.out_dir = out_dir
        self.rows_per_part = rows_per_part
        self.buffer: list[tuple[str, str, str, Conversation, str, bool]] = []
        self.parts: list[tuple[Path, Path, int]] = []  # (tmp, final, rows)

    def add(self, row: tuple[str, str, str, Conversation, str, bool]) -> None:
        self.buffer.append(row)
        if len(self.buffer) >= self.rows_per_part:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        final = self.out_dir / f"part-{len(self.parts):05d}.parquet"
        tmp = self.out_dir / f".{final.name}.tmp-{os.getpid()}"
        pq.write_table(_table(self.buffer), tmp, compression="zstd")
        self.parts.append((tmp, final, len(self.buffer)))
        self.buffer = []

    def finish(self) -> list[dict[str, Any]]:
        """Flush what is left; return the parts' manifest entries (file, rows, sha256)."""
        self._flush()
        return [{"file": final.name, "rows": rows, "sha256": _sha256(tmp)} for tmp, final, rows in self.parts]

    def commit(self, manifest: dict[str, Any]) -> None:
        """Move the parts into place, drop parts left by an older build, write the manifest last."""
        finals = {final.name for _, final, _ in self.parts}
        for tmp, final, _ in self.parts:
            os.replace(tmp, final)
        for stale in self.out_dir.glob("part-*.parquet"):
            if stale.name not in finals:
                stale.unlink()
        write_text(self.out_dir / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")

    def abort(self) -> None:
        for tmp, _, _ in self.parts:
            tmp.unlink(missing_ok=True)


def _table(rows: Sequence[tuple[str, str, str, Conversation, str, bool]]) -> pa.Table:
    # Built column-wise: much faster than from_pylist on nested dicts.
    offsets = [0]
    roles: list[str] = []
    contents: list[str] = []
    calls: list[Any] = []
    call_ids: list[str | None] = []
    names: list[str | None] = []
    for row in rows:
        for turn in row[3]:
            roles.append(turn[0])
            contents.append(turn[1])
            calls.append(getattr(turn, "tool_calls", None))
            call_ids.append(getattr(turn, "tool_call_id", None))
            names.append(getattr(turn, "name", None))
        offsets.append(len(roles))
    messages = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(roles, pa.string()), pa.array(contents, pa.string()), pa.array(calls, pa.list_(TOOL_CALL_TYPE)),
             pa.array(call_ids, pa.string()), pa.array(names, pa.string())],
            fields=list(MESSAGE_TYPE),
        ),
    )
    tools = [json.dumps(t, ensure_ascii=False) if (t := getattr(r[3], "tools", None)) else None for r in rows]
    return pa.Table.from_arrays(
        [
            pa.array([r[0] for r in rows], pa.string()),
            pa.array([r[1] for r in rows], pa.string()),
            pa.array([r[2] for r in rows], pa.string()),
            messages,
            pa.array([r[4] for r in rows], pa.string()),
            pa.array([r[5] for r in rows], pa.bool_()),
            pa.array(tools, pa.string()),
        ],
        schema=SCHEMA,
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    open_rows = open_source(spec, recipe.base_dir, recipe.seed)
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
    """Return the manifest of the mix built from `recipe` into `out_dir` (parquet parts + manifest.json)."""
    out = Path(out_dir)
    max_tokens = max_prompt_tokens if max_prompt_tokens is not None else recipe.filters.max_prompt_tokens
    if max_tokens is not None and tokenizer is None:
        raise ConfigError("max_prompt_tokens needs the target's tokenizer (build-mix --tokenizer PATH)")
    counter = filters.TokenCounter(tokenizer) if tokenizer is not None else None
    out.mkdir(parents=True, exist_ok=True)
    # A manifest marks a finished mix: remove the old one first so a failed rebuild is not mistaken for one.
    (out / MANIFEST).unlink(missing_ok=True)
    deduper = Deduper(exact=recipe.dedup.exact, near=recipe.dedup.near)
    pairs: Counter[tuple[int, int, str]] = Counter()
    writer = _PartWriter(out, recipe.rows_per_part)
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
        parts = writer.finish()
        manifest = _manifest(recipe, reports, pairs, parts, max_tokens)
        writer.commit(manifest)
    except BaseException:
        writer.abort()
        raise
    return manifest


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
        "columns": [f.name for f in SCHEMA],
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


def read_manifest(mix_dir: str | Path) -> dict[str, Any]:
    """Return a built mix's manifest; ConfigError if the folder holds no finished mix."""
    path = Path(mix_dir) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{mix_dir}: no {MANIFEST} (not a finished mix; run build-mix)") from None


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
