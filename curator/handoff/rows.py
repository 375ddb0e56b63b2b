"""The rows handed off: token ids and loss masks as the target emitted them, with their states when a store has them.

A row comes from a hidden-state store (its samples, with the states), from generation records in
token mode (the target's own ids, `training.records.chat_tokens.tokenize_rows`, no tokenizer), or
from both: then the records say which rows, and every row's ids and mask must be the store's
sample's, bit for bit (a store of another target or of other data is refused, never mixed in).
Ids are the store's: a record's id, with `#k` for a row of its own ending at message k.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from curator.handoff.errors import (
    Fp8StoreError,
    HandoffError,
    MissingStatesError,
    RetokenisedRowsError,
    StoreMismatchError,
)
from training.errors import TrainingError
from training.records.chat_tokens import GenerationReadStats, MalformedRecordError, iter_generation, tokenize_rows
from training.storage.format import StoreMeta
from training.storage.reader import HiddenStateStore
from training.target.config import read_target_config


@dataclass
class HandoffRow:
    """One row: ids [T] int64, loss mask [T] bool, and (from a store) aux [T, n_aux*H], final [T, H] after
    the target's final norm, final_prenorm [T, H] before it; all bf16."""

    id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    category: str = ""
    aux: torch.Tensor | None = None
    final: torch.Tensor | None = None
    final_prenorm: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class RecordRow:
    id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    category: str


class HandoffSource:
    """What one export reads: a store, generation records, or both (checked against each other)."""

    def __init__(self, store: HiddenStateStore | None, records: Path | None) -> None:
        self.store = store
        self.records = records
        self.read_stats = GenerationReadStats()

    @property
    def meta(self) -> StoreMeta | None:
        return self.store.meta if self.store is not None else None

    @property
    def has_states(self) -> bool:
        return self.store is not None

    def record_rows(self) -> Iterator[RecordRow]:
        """Yield the records' rows in order; a text-mode record or a malformed one is refused by name."""
        assert self.records is not None
        vocab = self.meta.vocab_size if self.meta is not None else None
        for record in iter_generation(self.records, self.read_stats):
            if record.get("mode") != "token":
                raise RetokenisedRowsError(
                    f"record {record['id']!r} in {self.records} is in text mode: its ids would be re-tokenised, not the "
                    "target's own; regenerate it with an engine that returns token ids (docs/generation.md)")
            try:
                rows = tokenize_rows(record, vocab_size=vocab)
            except MalformedRecordError as exc:
                raise HandoffError(f"{self.records}: {exc}") from None
            for row in rows:
                yield RecordRow(record["id"] + row.suffix, row.input_ids, row.loss_mask, str(record.get("category", "")))
        if self.read_stats.malformed:
            raise HandoffError(f"{self.records} holds {self.read_stats.malformed} malformed line(s); "
                               "an export hands off every record or none")

    def rows(self) -> Iterator[HandoffRow]:
        """Yield every row to hand off, in order (the records' order, else the store's)."""
        store = self.store
        if store is None:
            for r in self.record_rows():
                yield HandoffRow(r.id, r.input_ids, r.loss_mask, r.category)
            return
        if self.records is None:
            for sid in store.ids():
                yield _store_row(store, sid)
            return
        for r in self.record_rows():
            if r.id not in store:
                why = store.skipped.get(r.id, "never captured")
                raise MissingStatesError(f"row {r.id!r} of {self.records} has no hidden states in {store.root} ({why}); "
                                         "capture it (`curator hidden-states` resumes) or export the rows the store holds "
                                         "(leave out --records)")
            row = _store_row(store, r.id)
            if not (torch.equal(row.input_ids, r.input_ids) and torch.equal(row.loss_mask, r.loss_mask)):
                raise StoreMismatchError(f"row {r.id!r}: the store {store.root} holds other token ids or another loss mask "
                                         f"than {self.records}; it was captured from other data or for another target")
            yield row


def _store_row(store: HiddenStateStore, sid: str) -> HandoffRow:
    if store.mode(sid) == "text":
        raise RetokenisedRowsError(f"sample {sid!r} of {store.root} was captured from a text-mode record (ids re-tokenised, "
                                   "not the target's own); regenerate it in token mode and capture again")
    s = store[sid]
    return HandoffRow(sid, s.input_ids.long(), s.loss_mask.bool(), s.category, s.aux.to(torch.bfloat16),
                      None if s.final is None else s.final.to(torch.bfloat16), s.final_prenorm)


def open_source(store: str | Path | None, records: str | Path | None, *, target: str | Path | None = None,
                fp8_to_bf16: bool = False, prenorm: bool = False) -> HandoffSource:
    """Return the source of an export, its store checked against the target (when given) and its dtype;
    `prenorm`: rows carry the final state before the norm (read only for the layout that wants it)."""
    if store is None and records is None:
        raise HandoffError("nothing to export: pass --store (a hidden-state store) and/or --records (a generation output)")
    opened = None
    if store is not None:
        try:
            # every row read once; the layout wanting the pre-norm state needs no post-norm one
            opened = HiddenStateStore.open(store, prenorm=prenorm, final=not prenorm, pread=True)
        except TrainingError as exc:
            raise HandoffError(str(exc)) from None
        if opened.meta.dtype == "fp8" and not fp8_to_bf16:
            raise Fp8StoreError(f"{store} keeps fp8 states; the trainers read bf16: pass --fp8-to-bf16 to write them "
                                "dequantised (fp8's rounding stays in them), or capture a bf16 store")
        if target is not None and Path(target).is_dir():  # a Hub id only names the target in the launch line
            check_target(opened.meta, target)
    return HandoffSource(opened, Path(records) if records is not None else None)


def check_target(meta: StoreMeta, target: str | Path) -> None:
    """Refuse a store whose widths, depth or vocabulary are not the target's (a store of another target)."""
    try:
        cfg = read_target_config(target)
    except TrainingError as exc:
        raise HandoffError(str(exc)) from None
    ours = {"hidden_size": meta.hidden_size, "num_hidden_layers": meta.num_layers, "vocab_size": meta.vocab_size}
    differ = [f"{k} {v} (target {cfg.get(k)})" for k, v in ours.items() if cfg.get(k) != v]
    if differ:
        raise StoreMismatchError(f"the store was captured for another target ({meta.target}): {', '.join(differ)}; "
                                 f"capture it for {target}")
