"""What a capture run will store: records tokenised into prepared samples, length-sorted batches,
and the store's meta.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from training.capture.forward import text_config
from training.capture.ranks import owns
from training.capture.stats import ExtractStats
from training.records.chat_tokens import (
    MalformedRecordError,
    chat_template_sha256,
    tokenize_rows,
    tokenizer_sha256,
)
from training.storage.format import HiddenStateSample, StoreMeta
from training.target.config import text_part
from training.target.layers import CONVENTION, check_layer_ids, default_aux_layers


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Return batches of indices, longest first, each with (count x longest) <= batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * longest > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def max_positions(config: Any) -> int | None:
    """Return how many positions the target takes (a transformers config or its dict; None when it does not
    say). A rope scaling that names `original_max_position_embeddings` already counts in
    max_position_embeddings; one that only gives a `factor` (Qwen's yarn) stretches it by that factor."""
    cfg = text_part(config if isinstance(config, dict) else text_config(config).to_dict())
    n = cfg.get("max_position_embeddings")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return None
    scaling = cfg.get("rope_scaling") or {}
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 1 < factor <= 1024 \
            and "original_max_position_embeddings" not in scaling:
        return int(n * factor)
    return n


@dataclass
class PreparedSample:
    """A tokenised sample, ready for a forward pass."""

    id: str
    category: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    mode: str = "text"  # "token": the target's stored ids; "text": re-rendered from the record's text


def prepare_samples(
    records: Iterable[dict[str, Any]],
    tokenizer: Any,
    stats: ExtractStats,
    *,
    done: set[str],
    max_len: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    vocab_size: int | None = None,
    positions: int | None = None,
) -> Iterator[PreparedSample]:
    """Yield this rank's not-yet-stored records, tokenised with the chat template; count the rest
    (a record with a token id the target cannot take, at or past `vocab_size`, is malformed; a row
    longer than the target's `positions` after `max_len` is skipped as too_long: its states past the
    positions are meaningless, and one such forward pass holds a run for minutes)."""
    seen: set[str] = set()
    for rec in records:
        stats.records += 1
        sid = rec["id"]
        # Ownership first: another rank may store its share while this one is still reading.
        if not owns(sid, rank, world_size):
            stats.other_rank += 1
            continue
        # A record of one answer is one row under its own id. One of several answers may have
        # been split into rows `id#k` stored in other shards than `id`'s (batches are grouped by
        # length), so a killed run can leave some of them: such a record is looked at row by row.
        answers = sum(1 for m in rec.get("messages") or [] if isinstance(m, dict) and m.get("train"))
        if sid in seen or (sid in done and answers <= 1):
            stats.already_done += 1
            continue
        seen.add(sid)
        try:
            rows = tokenize_rows(rec, tokenizer, max_len=max_len, vocab_size=vocab_size)  # ids checked in range
        except MalformedRecordError:
            stats.malformed += 1
            continue
        # One row per generation whose context the template re-renders differently (stored ids
        # are used as they are); the row holding the last answer keeps the record's id.
        for toks in rows:
            if sid + toks.suffix in done:
                stats.already_done += 1
                continue
            if not bool(toks.loss_mask.any()):
                stats.no_loss_tokens += 1  # max_len cut every answer off: nothing to learn from it
                continue
            if positions is not None and len(toks.input_ids) > positions:
                stats.too_long += 1
                continue
            stats.truncated += int(toks.truncated)
            yield PreparedSample(sid + toks.suffix, str(rec.get("category", "")), toks.input_ids, toks.loss_mask,
                                 toks.mode)


def store_meta(
    config: Any,
    tokenizer: Any,
    *,
    target: str,
    layer_ids: list[int] | None,
    dtype: str,
    has_final: bool,
    has_final_prenorm: bool = False,
    extra: dict[str, Any] | None = None,
) -> StoreMeta:
    """Return the store metadata for a target config (transformers config or its dict) and tokenizer."""
    cfg = text_part(config if isinstance(config, dict) else text_config(config).to_dict())
    n = int(cfg["num_hidden_layers"])
    ids = check_layer_ids(layer_ids if layer_ids else default_aux_layers(n), n)
    return StoreMeta(
        target=target,
        hidden_size=int(cfg["hidden_size"]),
        num_layers=n,
        vocab_size=int(cfg["vocab_size"]),
        aux_layer_ids=ids,
        layer_convention=CONVENTION,
        dtype=dtype,
        has_final=has_final,
        has_final_prenorm=has_final_prenorm,
        chat_template_sha256=chat_template_sha256(tokenizer),
        tokenizer_sha256=tokenizer_sha256(tokenizer),
        extra=dict(extra or {}),
    )


def sample_windows(items: Iterable[PreparedSample], size: int) -> Iterator[list[PreparedSample]]:
    chunk: list[PreparedSample] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class OnDemandStates(ABC):
    """The read side of a store whose states are made on demand from prepared samples (the target in
    process, a serving engine): ids, lengths, categories and tokens come from the samples without
    running anything; `load_many` makes the states. Subclasses set `_samples` (id -> sample, in order)."""

    _samples: dict[str, PreparedSample]

    def ids(self) -> list[str]:
        """Return the sample ids in generation order."""
        return list(self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    def __contains__(self, sid: object) -> bool:
        return sid in self._samples

    def length(self, sid: str) -> int:
        """Return the token count of sample `sid`."""
        return int(self._samples[sid].input_ids.shape[0])

    def category(self, sid: str) -> str:
        """Return the category of sample `sid`."""
        return self._samples[sid].category

    def tokens(self, sid: str) -> PreparedSample:
        """Return the tokens and loss mask of `sid` without making its states."""
        return self._samples[sid]

    def __getitem__(self, sid: str) -> HiddenStateSample:
        return self.load_many([sid])[0]

    @abstractmethod
    def load_many(self, ids: list[str]) -> list[HiddenStateSample]:
        """Return the samples `ids` with their states."""

