"""`curator export-data`: the curated rows (and their states) written in a trainer's layout, published whole.

Every refusal (a store of another target, missing states, a layout the data cannot hold, fp8 states)
is one HandoffError before or while the rows stream into a staging folder beside OUT; the folder is
swapped in by one rename when every file is written and fsynced (training.io.publish, as build-mix
and export do), so a reader never finds half an export and a failed one leaves OUT as it was.

OUT/curator-handoff.json, the manifest:
    format "curator-handoff/1", layout, trainer, verified (the trainer version whose loaders read it),
    rows, tokens, loss_tokens, ids (row i's id: file i), categories, aux_layer_ids (trainer's numbering),
    aux_layer_ids_curator (layer inputs), layer_convention, final_norm, source {store, records, target,
    dtype, converted_from}, files (the layout's file names), launch, traps [{name, message}]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curator.handoff.errors import HandoffError, LayoutCannotHoldError
from curator.handoff.layouts import LAYOUTS
from curator.handoff.layouts.base import FileSink, Layout, Trap
from curator.handoff.rows import HandoffSource, open_source
from training.io.atomic import write_json
from training.io.diskspace import named_disk_full
from training.io.outlock import OutputBusyError, OutputLock
from training.io.publish import Publisher

FORMAT = "curator-handoff/1"
MANIFEST = "curator-handoff.json"
STAGE_TAG = "export-data"
_MARK = ".curator-handoff-stage"  # first file of a staging folder: what a leftover of a killed export holds


@dataclass
class ExportReport:
    out: Path
    layout: str
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    files: int = 0
    bytes_written: int = 0
    launch: str = ""
    traps: list[Trap] = field(default_factory=list)
    aux_layer_ids: list[int] | None = None


def layout_named(name: str) -> Layout:
    """Return the layout `name`; HandoffError listing the known ones otherwise."""
    layout = LAYOUTS.get(name)
    if layout is None:
        raise HandoffError(f"no layout {name!r}; choose one of {', '.join(LAYOUTS)}")
    return layout


def _owns(folder: Path) -> bool:
    return (folder / _MARK).exists() or (folder / MANIFEST).exists()


def export_data(
    layout_name: str,
    out: str | Path,
    *,
    store: str | Path | None = None,
    records: str | Path | None = None,
    target: str | Path | None = None,
    fp8_to_bf16: bool = False,
    workers: int = 4,
    on_row: Callable[[int], None] | None = None,
) -> ExportReport:
    """Write the rows of `store` and/or `records` at `out` in `layout_name`'s layout; return what was written."""
    layout = layout_named(layout_name)
    source = open_source(store, records, target=target, fp8_to_bf16=fp8_to_bf16, prenorm=layout.final_norm == "before")
    if layout.needs_states and not source.has_states:
        others = [n for n, lay in LAYOUTS.items() if not lay.needs_states]
        raise LayoutCannotHoldError(f"{layout.name} holds hidden states and none were given: pass --store "
                                    f"(`curator hidden-states`), or choose a layout of token ids only ({', '.join(others)})")
    layout.check(source)
    dest = Path(out).absolute()
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not (dest / MANIFEST).exists())):
        raise HandoffError(f"{dest} exists and is not an export of `curator export-data`; choose another --out "
                           "(nothing there is replaced)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = OutputLock(dest.parent, f".{dest.name}.export-data.lock", "curator export-data", guards=dest)
    try:
        lock.acquire()
    except OutputBusyError:
        raise HandoffError(f"{dest} is being written by another `curator export-data` ({lock.holder()}); "
                           "wait for it or choose another --out") from None
    try:
        pub = Publisher.of(dest, STAGE_TAG, owns=_owns)
        pub.remove_stale()
        with named_disk_full(dest), pub.staged() as stage:
            (stage / _MARK).touch()
            report = _write(layout, source, stage, dest, target, workers, on_row)
            (stage / _MARK).unlink()
        return report
    finally:
        lock.release()


def _write(layout: Layout, source: HandoffSource, stage: Path, dest: Path, target: str | Path | None, workers: int,
           on_row: Callable[[int], None] | None) -> ExportReport:
    meta = source.meta
    curator_ids = list(meta.aux_layer_ids) if meta is not None else None
    # a layout of token ids only still names, in its launch line, the layers the store was captured at
    ids = layout.trainer_layer_ids(curator_ids) if curator_ids is not None else None
    report = ExportReport(dest, layout.name, aux_layer_ids=ids)
    row_ids: list[str] = []
    categories: dict[str, int] = {}
    sink = FileSink(workers=workers)
    try:
        writer = layout.writer(stage, source, sink)
        for index, row in enumerate(source.rows()):
            writer.add(index, row)
            row_ids.append(row.id)
            categories[row.category] = categories.get(row.category, 0) + 1
            report.rows += 1
            report.tokens += len(row)
            report.loss_tokens += int(row.loss_mask.sum())
            if on_row is not None:
                on_row(1)
        if not row_ids:
            raise HandoffError("no rows to export: the store and records are empty")
        files = writer.close()
    finally:
        sink.close()
    report.files, report.bytes_written = sink.files, sink.bytes_written
    where = str(target or (meta.target if meta is not None else "TARGET"))
    report.launch = layout.launch(dest, where, ids)
    report.traps = layout.traps()
    manifest: dict[str, Any] = {
        "format": FORMAT, "layout": layout.name, "trainer": layout.trainer, "verified": layout.verified,
        "rows": report.rows, "tokens": report.tokens, "loss_tokens": report.loss_tokens, "ids": row_ids,
        "categories": categories, "aux_layer_ids": ids, "aux_layer_ids_curator": curator_ids,
        "layer_convention": "output" if layout.layer_offset else "layer-input",
        "final_norm": layout.final_norm if source.has_states else None,
        "source": {"store": str(source.store.root) if source.store is not None else None,
                   "records": str(source.records) if source.records is not None else None,
                   "target": meta.target if meta is not None else None,
                   "dtype": "bf16" if meta is not None else None,
                   "converted_from": "fp8" if meta is not None and meta.dtype == "fp8" else None},
        "files": files, "launch": report.launch, "traps": [{"name": t.name, "message": t.message} for t in report.traps],
    }
    write_json(stage / MANIFEST, manifest, indent=1)
    return report
