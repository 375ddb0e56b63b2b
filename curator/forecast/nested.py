"""The points a forecast fits, made here: one draft trained per nested subset of one pool."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curator.errors import ConfigError
from curator.forecast.law import check_acceptance
from curator.forecast.runs import category_counts


def nested_subsets(ids_by_category: Mapping[str, Sequence[str]], fractions: Sequence[float], seed: int = 0) -> dict[float, list[str]]:
    """Return, per fraction, the ids of a subset: each category's ids in one seeded order, cut at
    the fraction, so that every subset holds the smaller ones and the category shares stay the pool's."""
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ConfigError(f"fractions must lie in (0, 1], not {list(fractions)}")
    orders = {}
    for cat in sorted(ids_by_category):
        ids = sorted(ids_by_category[cat])
        random.Random(f"{seed}:{cat}").shuffle(ids)
        orders[cat] = ids
    return {f: sorted(sid for ids in orders.values() for sid in ids[: max(1, round(f * len(ids)))])
            for f in sorted(set(fractions))}


def subset_store(store_dir: str | Path, ids: Iterable[str], out: str | Path,
                 entries: Mapping[str, Any] | None = None) -> Path:
    """Write a read-only view of a hidden-state store holding only `ids` (its own meta and index,
    the shards linked, never copied); return its directory. `entries`: the store's index entries
    when the caller already read them."""
    from training.io.atomic import output_folder
    from training.storage.index import atomic_write_json, read_index

    src, out = Path(store_dir).resolve(), Path(out)
    if entries is None:
        entries, _ = read_index(src)
    missing = [sid for sid in ids if sid not in entries]
    if missing:
        raise ConfigError(f"{src}: {len(missing)} ids are not in the store (first: {missing[0]})")
    out = output_folder(out.parent, out.name)  # a planted link never sends index.json elsewhere
    atomic_write_json(out / "meta.json", json.loads((src / "meta.json").read_text(encoding="utf-8")))
    atomic_write_json(out / "index.json", {"samples": {sid: entries[sid] for sid in ids}, "skipped": {}})
    link = out / "shards"
    if link.is_symlink() or link.exists():
        if not (link.is_symlink() and link.resolve() == (src / "shards").resolve()):
            raise ConfigError(f"{link} exists and is not a link to {src / 'shards'}; pick an empty --out")
    else:
        link.symlink_to(src / "shards", target_is_directory=True)
    return out


@dataclass
class NestedRun:
    """One draft trained on a nested subset: its fraction, run directory, figures and budget."""

    fraction: float
    run_dir: str
    counts: dict[str, int]
    acceptance: dict[str, float]
    steps: int
    train_steps: int = 0  # optimizer steps it took
    batch_size: int = 0  # sequences per step
    epochs: float | None = None  # train_steps x batch_size / its training samples
    reused: bool = False  # finished before this call (--resume): read back, not trained again


def train_nested(
    store: str | Path,
    target: str | Path,
    out: str | Path,
    fractions: Sequence[float],
    base: Mapping[str, Any],
    *,
    eval_store: str | Path | None = None,
    seed: int = 0,
    resume: bool = False,
    on_run: Any = None,
    on_metrics: Any = None,
) -> list[NestedRun]:
    """Train one draft per fraction on nested subsets of `store` (same settings `base`, a TrainConfig
    dict: its epochs or max_steps are the budget the full mix will train with) and return each one's
    per-category simulated acceptance on the held-out samples (`eval_store`, or a hashed 5% of
    `store` set apart once for every subset) and the steps and epochs it trained.

    `resume`: a subset whose run finished is read back, one that was stopped (a kill, a full disk)
    continues from its last checkpoint, exactly (the trainer's --resume: it refuses a changed config
    or changed data). `on_metrics(fraction)` returns the trainer's metrics callback for that
    subset's run (a progress bar)."""
    from training.feed.batches import split_eval
    from training.io.atomic import output_folder
    from training.storage.index import read_index
    from training.train.config import TrainConfig
    from training.train.trainer import train

    out = Path(out)
    entries, _ = read_index(Path(store))
    ids = sorted(entries)
    if eval_store is None:
        ids, held = split_eval(ids, 0.05)
        if not held:
            raise ConfigError(f"{store}: too few samples to set 5% apart for evaluation; pass --eval-store")
        eval_store = subset_store(store, held, out / "heldout", entries)
    by_cat: dict[str, list[str]] = {}
    for sid in ids:
        by_cat.setdefault(str(entries[sid].get("category") or "all"), []).append(sid)
    runs = []
    for frac, chosen in nested_subsets(by_cat, fractions, seed).items():
        view = subset_store(store, chosen, out / f"subset-{frac:g}", entries)
        cfg = TrainConfig.from_dict({**base, "data": str(view), "eval_data": str(eval_store), "target": str(target),
                                     "out": str(output_folder(out, f"run-{frac:g}")), "max_train_samples": None,
                                     "seed": seed})
        finished = resume and (Path(cfg.out) / "summary.json").is_file()
        result = train(cfg, resume=resume, on_metrics=None if finished or on_metrics is None else on_metrics(frac))
        ev = result.eval or {}
        k = int(ev.get("sim_steps") or cfg.ttt_steps)
        raw = ev.get("sim_categories")
        if not isinstance(raw, dict) or not raw:
            raise ConfigError(f"run {cfg.out}: its evaluation gave no per-category acceptance")
        acc = {str(c): check_acceptance(v, k, f"run {cfg.out}, category {c}") for c, v in raw.items()}
        run = NestedRun(frac, cfg.out, category_counts(entries, chosen), acc, k, result.step, cfg.global_batch_size,
                        result.step * cfg.global_batch_size / max(len(chosen), 1), finished)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs
