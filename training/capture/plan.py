"""The disk bill of a hidden-state capture, before paying it.

Per token the store keeps the aux states of three layers (3 x H values) and, by default, the final
normed state (H more, what the trainer turns into the target's logits), at 2 bytes a value in bf16
or 1 byte plus a float32 scale per H-wide row in fp8; plus a 4-byte token id and a 1-byte mask.
Kimi-K2.5 (H = 7168, 61 layers), 10K samples of 2,103 tokens, three bf16 layers:
10,000 x 2,103 x 3 x 7,168 x 2 B = 0.90 TB (1.21 TB with the final state); 100K samples: 9.0 TB.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.errors import TrainingError
from training.records.chat_tokens import MalformedRecordError, template_messages, template_options, tokenize_rows
from training.storage.format import bytes_per_token
from training.target.config import config_path, read_target_config

DEFAULT_MAX_LENS = (1024, 512)


@dataclass
class ModelShape:
    """The widths that set the bill: hidden size, layer count, vocabulary."""

    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int


def load_shape(model: str | Path) -> ModelShape:
    """Return the shape from a model directory, its config.json, or any HF-style config dict file (JSON).

    Multimodal configs (Kimi-K2.5) keep the language model's widths under `text_config`.
    """
    path = Path(model)
    if not config_path(path).exists():
        raise TrainingError(f"{path}: no such config; pass a model directory, its config.json or a config dict file")
    cfg = read_target_config(path)
    cfg_path = config_path(path)
    name = path.name if path.is_dir() else (cfg_path.parent.name if cfg_path.name == "config.json" else cfg_path.stem)
    return ModelShape(name, cfg["hidden_size"], cfg["num_hidden_layers"], int(cfg.get("vocab_size", 0) or 0))


def record_length(record: dict[str, Any], tokenizer: Any | None, vocab_size: int | None = None) -> tuple[int, str]:
    """Return (token count of a generation record, how it was measured).

    Token-mode records: their stored ids (MalformedRecordError for one outside int64, or at/past `vocab_size`). With the target's tokenizer: the exact chat-template length
    (tools included). Without one: the request's usage
    (prompt + completion tokens of its last call), else characters / 4.
    """
    if record.get("mode") == "token":
        # The target's own ids, as hidden-states stores them (a row per re-rendered generation).
        return sum(len(row) for row in tokenize_rows(record, vocab_size=vocab_size)), "stored ids"
    if tokenizer is not None:
        messages, _ = template_messages(record)
        try:
            ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **template_options(record))
        except Exception as exc:  # jinja and the tokenizers binding raise many types for a conversation they refuse
            raise MalformedRecordError(f"record {record.get('id')!r}: the chat template refused it ({exc})") from exc
        return len(ids), "chat template"
    usage = record.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        return usage["prompt_tokens"] + int(usage.get("completion_tokens") or 0), "usage"
    messages, _ = template_messages(record)
    chars = sum(len(m["content"]) + len(m.get("reasoning_content", "")) for m in messages)
    return max(1, chars // 4), "chars/4"


def data_lengths(
    records: Iterable[dict[str, Any]], tokenizer: Any | None, vocab_size: int | None = None
) -> tuple[list[int], str, int]:
    """Return (per-sample token counts, measurement method, malformed records skipped: a token id
    outside the int64 range, or at/past `vocab_size` when given, makes a record malformed)."""
    lengths: list[int] = []
    methods: set[str] = set()
    bad = 0
    for rec in records:
        try:
            n, how = record_length(rec, tokenizer, vocab_size)
        except MalformedRecordError:
            bad += 1
            continue
        lengths.append(n)
        methods.add(how)
    return lengths, "+".join(sorted(methods)) or "none", bad


@dataclass
class PlanRow:
    """Tokens and bytes for one max_len (None: no clipping)."""

    max_len: int | None
    tokens: int
    aux_bytes: int  # the aux layers alone
    aux_final_bytes: int  # aux layers + the final state (the default store)
    store_bytes: int  # this plan's store (one of the two)
    saving: float  # fraction of the unclipped store bytes saved


@dataclass
class DiskPlan:
    """The bill: per-token bytes, totals per max_len, free disk at the output."""

    shape: ModelShape
    samples: int
    dtype: str
    n_aux: int
    has_final: bool
    lengths_from: str
    aux_bytes_per_token: int
    store_bytes_per_token: int
    rows: list[PlanRow]
    chosen: PlanRow
    out_dir: str | None = None
    free_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        """Return whether the chosen store fits the free disk (None when no --out was given)."""
        return None if self.free_bytes is None else self.chosen.store_bytes <= self.free_bytes


def free_disk(path: str | Path) -> tuple[Path, int]:
    """Return (the existing directory measured, its free bytes) for `path` or its nearest existing parent."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return p, shutil.disk_usage(p).free


def make_plan(
    shape: ModelShape,
    *,
    lengths: list[int] | None = None,
    samples: int | None = None,
    avg_tokens: float | None = None,
    max_len: int | None = None,
    dtype: str = "bf16",
    n_aux: int = 3,
    has_final: bool = True,
    out_dir: str | Path | None = None,
    lengths_from: str = "",
    has_final_prenorm: bool = False,
) -> DiskPlan:
    """Return the disk plan for a real length distribution (`lengths`) or `samples` x `avg_tokens`."""
    if lengths is None:
        if not samples or not avg_tokens or samples <= 0 or avg_tokens <= 0:
            raise TrainingError("give the data (--data GEN_DIR) or both --samples and --avg-tokens (positive)")
        n = int(samples)
        lengths_from = f"{n} samples x {avg_tokens:g} tokens (assumed equal; --data gives the real distribution)"

        def total(limit: int | None) -> int:
            return round(n * (min(avg_tokens, limit) if limit else avg_tokens))
    else:
        n = len(lengths)

        def total(limit: int | None) -> int:
            return sum(min(t, limit) if limit else t for t in lengths)

    aux_bpt = bytes_per_token(shape.hidden_size, n_aux, dtype, False)
    final_bpt = bytes_per_token(shape.hidden_size, n_aux, dtype, True)
    # the pre-norm final state (--final-prenorm) is part of the store's bill, not of the columns
    store_bpt = bytes_per_token(shape.hidden_size, n_aux, dtype, has_final, has_final_prenorm)
    limits: list[int | None] = [None, *DEFAULT_MAX_LENS]
    if max_len and max_len not in limits:
        limits.insert(1, max_len)
    full = total(None) * store_bpt
    rows = []
    for limit in limits:
        tokens = total(limit)
        store = tokens * store_bpt
        rows.append(PlanRow(limit, tokens, tokens * aux_bpt, tokens * final_bpt, store, 1 - store / full if full else 0.0))
    chosen = next(r for r in rows if r.max_len == (max_len or None))
    plan = DiskPlan(shape, n, dtype, n_aux, has_final, lengths_from, aux_bpt, store_bpt, rows, chosen)
    if out_dir is not None:
        measured, free = free_disk(out_dir)
        plan.out_dir, plan.free_bytes = str(measured), free
    return plan


def refuse_if_it_will_not_fit(plan: DiskPlan, already_stored: int = 0) -> None:
    """Raise TrainingError when the chosen store (less what is already written) exceeds the free disk."""
    if plan.free_bytes is None:
        return
    need = max(0, plan.chosen.store_bytes - already_stored)
    if need > plan.free_bytes:
        raise TrainingError(
            f"the store needs {_gb(need)} more but {plan.out_dir} has {_gb(plan.free_bytes)} free; "
            "free space, pick another --out, lower --max-len, use --dtype fp8, or pass --force"
        )


def _gb(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"
