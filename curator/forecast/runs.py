"""The points a forecast fits, read from finished `curator train` runs."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curator.forecast.law import BadPointError, Point, check_acceptance


def category_counts(entries: Mapping[str, Mapping[str, Any]], ids: Iterable[str]) -> dict[str, int]:
    """Return how many of `ids` each category holds in a store's index entries."""
    return dict(Counter(str(entries[sid].get("category") or "all") for sid in ids))


@dataclass
class RunFigures:
    """What one finished `curator train` run gives the forecast."""

    counts: dict[str, int]  # training samples per category
    acceptance: dict[str, float]  # per category
    steps: int  # K, the chain length the acceptance is of
    train_steps: int  # optimizer steps it took
    batch_size: int  # sequences per step
    epochs: float  # train_steps x batch_size / its training samples: how often it saw each sample
    max_steps: int | None = None  # its config's fixed step budget (None: it trained a number of epochs)

    def point_source(self) -> tuple[dict[str, int], dict[str, float], float]:
        return self.counts, self.acceptance, self.epochs


def run_point(run_dir: str | Path) -> RunFigures:
    """Return the figures of a finished `curator train` run: a `curator eval --json` report saved as
    RUN/eval.json (measured) when present, else the simulated per-category acceptance of the run's
    final evaluation; with the budget it trained (steps, batch, epochs). A figure that cannot be an
    acceptance is a BadPointError naming the run."""
    from training.errors import TrainingError
    from training.feed.batches import training_ids
    from training.storage.index import read_index

    run = Path(run_dir)
    if not run.is_dir():
        raise BadPointError(f"{run}: no such run directory" if not run.exists() else f"{run}: not a run directory")
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        ckpt = Path(summary["checkpoint"])
        meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
        cfg = meta.get("train_config", {})
        store = Path(meta["store"]["path"]) if "store" in meta else Path(cfg.get("data", ""))
        entries, _ = read_index(store)  # in index order, as the trainer reads the store's ids
        ids, _ = training_ids(list(entries), separate_eval=bool(cfg.get("eval_data")),
                              eval_fraction=cfg.get("eval_fraction", 0.05), eval_max_samples=cfg.get("eval_max_samples"),
                              max_train_samples=cfg.get("max_train_samples"))
        report = json.loads((run / "eval.json").read_text(encoding="utf-8")) if (run / "eval.json").exists() else None
    except FileNotFoundError as exc:  # a run stopped early, or another folder: name the file, not the errno
        raise BadPointError(f"{run}: not a finished `curator train` run: no {exc.filename}") from None
    except (OSError, KeyError, TypeError, AttributeError, ValueError, RecursionError, TrainingError) as exc:
        raise BadPointError(f"{run}: not a finished training run ({type(exc).__name__}: {exc})") from None
    counts = category_counts(entries, ids)
    if report is not None:
        cats = report.get("categories") if isinstance(report, dict) else None
        if not isinstance(cats, dict):
            raise BadPointError(f"{run}/eval.json: not a `curator eval --json` report (no \"categories\" object)")
        raw = {c: v.get("acceptance_length") if isinstance(v, dict) else v for c, v in cats.items()}
        k_raw = report.get("steps") or meta.get("ttt_steps") or cfg.get("ttt_steps")
        where = f"{run}/eval.json"
    else:
        ev = summary.get("eval") if isinstance(summary, dict) else None
        ev = ev if isinstance(ev, dict) else {}
        raw = ev.get("sim_categories") or {}
        if not isinstance(raw, dict) or not raw:
            raise BadPointError(f"{run}: its final evaluation has no per-category acceptance (train with eval_data or "
                                "eval_fraction > 0, or save `curator eval --json` as eval.json in the run)")
        k_raw = ev.get("sim_steps") or meta.get("ttt_steps") or cfg.get("ttt_steps")
        where = f"{run}/summary.json"
    if isinstance(k_raw, bool) or not isinstance(k_raw, int) or k_raw < 1:
        raise BadPointError(f"{where}: chain length {k_raw!r} is not a positive whole number")
    acc = {str(c): check_acceptance(v, k_raw, f"{where}, category {c}") for c, v in raw.items()}
    step, batch = summary.get("step"), cfg.get("global_batch_size")
    for name, v in (("step", step), ("global_batch_size", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadPointError(f"{run}: its {name} {v!r} is not a positive whole number")
    fixed = cfg.get("max_steps")
    return RunFigures(counts, acc, k_raw, step, batch, step * batch / max(len(ids), 1),
                      fixed if isinstance(fixed, int) and not isinstance(fixed, bool) and fixed > 0 else None)


def points_by_category(runs: Sequence[tuple[Any, ...]]) -> dict[str, list[Point]]:
    """Return each category's points over runs, each a (counts, acceptance) or (counts, acceptance,
    epochs) tuple (a category a run did not train on is left out)."""
    out: dict[str, list[Point]] = {}
    for run in runs:
        counts, acc = run[0], run[1]
        epochs = float(run[2]) if len(run) > 2 and run[2] is not None else None
        for cat, value in acc.items():
            if counts.get(cat):
                out.setdefault(cat, []).append(Point(int(counts[cat]), float(value), epochs=epochs))
    return out


def left_out_categories(runs: Sequence[tuple[Any, ...]]) -> dict[str, str]:
    """Return {category: why} for each category a run trained on or measured that no run gives a point
    (points_by_category needs both its training samples and its acceptance in the same run)."""
    kept = set(points_by_category(runs))
    trained: Counter[str] = Counter()
    measured: set[str] = set()
    for run in runs:
        trained.update({c: int(n) for c, n in run[0].items() if n})
        measured.update(run[1])
    out = {}
    for cat in sorted((set(trained) | measured) - kept):
        if cat not in measured:
            out[cat] = (f"trained on ({trained[cat]:,} samples over the runs) but no run measured its acceptance: "
                        "no held-out samples of it")
        elif not trained[cat]:
            out[cat] = "measured, but no run trained on it"
        else:
            out[cat] = "no run both trained on it and measured it"
    return out
