"""Does `curator forecast` predict the large draft from the small ones: read a multi-domain reference
JSON (run.py's `--out`), fit on the matched drafts of at most `--fit-max` samples, predict the
matched `--predict` draft(s) per category and traffic-weighted by the profile's shares, and print
predicted / band / actual / error per figure (measured, simulated).

The fit is curator.forecast's: acceptance against the effective data of each draft (its samples
per category and the epochs it trained, Muennighoff et al.'s repeats), the band drawn from the
mixture over law and R* plus one more draft's scatter. Beside it, the old fit on samples alone
(the best law by residual, its line's band), as the 2026-12-01 run's check made it.

Each draft's budget, in this order: the curve point whose simulated figure is the draft's own,
`train_steps` x batch / samples (batch: the draft's `batch_size`, else the settings' `batch`), its
`epochs`. (`stopped_at_epoch` is not used: fair.py writes there the best held-out epoch, while a
draft's figures are those of its last one.) Drafts of an EAGLE-3.1 `variant` are left out. `--curves` also fits
every evaluated epoch of the small drafts' curves (simulated figure only; those points sit before
the learning rate's decay has finished, so they read low for their budget: off by default).

    python3 bench/reference_multidomain/forecast_check.py RESULTS.json [--json OUT] [--curves]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from curator import forecast as fc  # noqa: E402

FIGURES = ("measured", "simulated")
GOAL = 0.05  # the forecast's goal: within 5% of the large draft, its band holding it


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def draft_epochs(row: dict[str, Any], settings: dict[str, Any]) -> float | None:
    """Return the epochs the draft's figures were taken at (None: the JSON does not say)."""
    n = _number(row.get("samples"))
    if not n:
        return None
    target = _number(row.get("simulated_weighted"))
    for point in row.get("curve") or []:
        if target is not None and _number(point.get("simulated_weighted")) is not None \
                and abs(point["simulated_weighted"] - target) < 1e-9:
            if (seq := _number(point.get("sequences"))) is not None:
                return seq / n
            if (ep := _number(point.get("epoch"))) is not None:
                return ep
    steps, batch = _number(row.get("train_steps")), _number(row.get("batch_size")) or _number(settings.get("batch"))
    if steps and batch:
        return steps * batch / n
    return _number(row.get("epochs"))


def matched(drafts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the matched arm's drafts (by `arm` when the JSON has it, else by tag)."""
    if any("arm" in r for r in drafts.values()):
        return {t: r for t, r in drafts.items() if r.get("arm") == "matched" and not r.get("variant")}
    return {t: r for t, r in drafts.items() if t.startswith("matched-") and not r.get("variant")}


def _points(rows: dict[str, dict[str, Any]], figure: str, steps: int, settings: dict[str, Any], curves: bool,
            skipped: list[str]) -> dict[str, list[fc.Point]]:
    out: dict[str, list[fc.Point]] = {}

    def add(tag: str, counts: dict[str, Any], acc: dict[str, Any], epochs: float | None) -> None:
        for cat, value in (acc or {}).items():
            n = _number((counts or {}).get(cat))
            if not n:
                continue
            try:
                a = fc.check_acceptance(value, steps, f"{tag}, {figure} {cat}")
            except fc.BadPointError as exc:
                skipped.append(str(exc))
                continue
            out.setdefault(cat, []).append(fc.Point(int(n), a, epochs=epochs))

    for tag, row in rows.items():
        add(tag, row.get("category_samples"), row.get(figure), draft_epochs(row, settings))
        if curves and figure == "simulated":
            own = _number(row.get("simulated_weighted"))
            for point in row.get("curve") or []:
                if own is not None and _number(point.get("simulated_weighted")) == own:
                    continue  # the draft's own figure, added above
                seq, n = _number(point.get("sequences")), _number(row.get("samples"))
                ep = seq / n if seq is not None and n else _number(point.get("epoch"))
                add(f"{tag} epoch {point.get('epoch')}", row.get("category_samples"), point.get("simulated"), ep)
    return out


def _band(draws: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in np.percentile(draws, fc.BAND)]


def check(saved: dict[str, Any], fit_max: int = 2000, predict: int | None = None, curves: bool = False,
          seed: int = 1) -> dict[str, Any]:
    """Return, per figure, the prediction for the large matched draft(s) from the small ones, per
    category and weighted by the profile's shares, beside the old samples-alone fit."""
    settings = saved.get("settings") or {}
    steps = int(settings.get("ttt_steps") or 0)
    if steps < 1:
        raise SystemExit("the JSON's settings give no ttt_steps (the chain length K)")
    shares = {c: float(v) for c, v in ((saved.get("profile") or {}).get("shares") or {}).items() if _number(v)}
    rows = matched(saved.get("drafts") or {})
    small = {t: r for t, r in rows.items() if (_number(r.get("samples")) or 0) <= fit_max}
    sizes = sorted({int(r["samples"]) for r in rows.values() if (_number(r.get("samples")) or 0) > fit_max})
    if predict is None and sizes:
        predict = sizes[-1]
    large = {t: r for t, r in rows.items() if _number(r.get("samples")) == predict}
    if len({int(r["samples"]) for r in small.values()}) < fc.MIN_SIZES or not large:
        raise SystemExit(f"need matched drafts of {fc.MIN_SIZES}+ sizes <= {fit_max} and one of {predict} samples; "
                         f"the JSON has {sorted({r.get('samples') for r in rows.values()})}")
    out: dict[str, Any] = {"fit_from": sorted(small), "predict": sorted(large), "curves": curves, "figures": {}}
    skipped: dict[str, list[str]] = {f: [] for f in FIGURES}
    by_figure = {f: _points(small, f, steps, settings, curves, skipped[f]) for f in FIGURES}
    # one R* for both figures: how much a repeat is worth belongs to the training, and both figures
    # measure the same drafts (the simulated one, on 200 prompts, pins it far better)
    weights = fc.r_star_weights({f"{f}/{c}": p for f, pts in by_figure.items() for c, p in pts.items()}, steps)
    out["r_star"] = _r_summary(weights)
    for figure in FIGURES:
        pts = by_figure[figure]
        fig: dict[str, Any] = {"skipped": skipped[figure], "categories": {}}
        preds: dict[str, dict[str, Any]] = {}
        for cat, points in sorted(pts.items()):
            ens = fc.fit_ensemble(points, steps, weights)
            _, old = fc.best_fit([fc.Point(p.samples, p.acceptance) for p in points], steps)
            # the large drafts (one per seed) that measured this category: their mean is the actual
            have = [r for r in large.values() if _number((r.get(figure) or {}).get(cat)) is not None
                    and _number((r.get("category_samples") or {}).get(cat))]
            if ens is None or not have:
                continue
            n = float(np.mean([r["category_samples"][cat] for r in have]))
            actual = [float(r[figure][cat]) for r in have]
            ep = [draft_epochs(r, settings) for r in have]
            e = float(np.mean(ep)) if all(v is not None for v in ep) else None
            draws = ens.predict_draws(n, seed, e, noise=True)
            preds[cat] = {"pred": ens.predict(n, e), "draws": draws, "actual": float(np.mean(actual)),
                          "old": old.predict(n) if old else None,
                          "old_draws": old.predict_draws(n, seed) if old else None}
            fig["categories"][cat] = _row(preds[cat]) | {"samples": n, "epochs": e, "law": ens.law,
                                                          "points": len(points)}
        common = [c for c in preds if shares.get(c)]
        if common:
            total = sum(shares[c] for c in common)
            w = {k: sum(preds[c][k] * shares[c] for c in common) / total for k in ("pred", "actual")}
            mix = sum(preds[c]["draws"] * shares[c] for c in common) / total
            weighted = {"pred": w["pred"], "draws": mix, "actual": w["actual"]}
            if all(preds[c]["old"] is not None for c in common):
                weighted["old"] = sum(preds[c]["old"] * shares[c] for c in common) / total
                weighted["old_draws"] = sum(preds[c]["old_draws"] * shares[c] for c in common) / total
            # the JSON's own weighted figure (its categories may weigh a category this fit lacks)
            own = [v for r in large.values() if (v := _number(r.get(f"{figure}_weighted"))) is not None]
            fig["weighted"] = _row(weighted) | {"actual_in_json": float(np.mean(own)) if own else None,
                                                "categories": common}
        out["figures"][figure] = fig
    return out


def _row(p: dict[str, Any]) -> dict[str, Any]:
    band = _band(p["draws"])
    err = p["pred"] / p["actual"] - 1
    row = {"predicted": round(p["pred"], 4), "band": band, "actual": round(p["actual"], 4), "error": round(err, 4),
           "within_5_percent": abs(err) <= GOAL, "band_holds_actual": band[0] <= p["actual"] <= band[1]}
    if p.get("old") is not None:
        old_band = _band(p["old_draws"])
        row["samples_alone"] = {"predicted": round(p["old"], 4), "band": old_band,
                                "error": round(p["old"] / p["actual"] - 1, 4),
                                "band_holds_actual": old_band[0] <= p["actual"] <= old_band[1]}
    return row


def _r_summary(weights: dict[float | None, float]) -> dict[str, Any]:
    if None in weights:
        return {"budget": "not recorded: samples alone"}
    rs = np.asarray(list(weights), dtype=np.float64)
    w = np.asarray(list(weights.values()))
    cdf = np.cumsum(w)
    return {"median": round(float(rs[np.searchsorted(cdf, 0.5)]), 3),
            "p10": round(float(rs[np.searchsorted(cdf, 0.1)]), 3), "p90": round(float(rs[np.searchsorted(cdf, 0.9)]), 3)}


def render(result: dict[str, Any]) -> str:
    lines = [f"fit on {', '.join(result['fit_from'])}; predicting {', '.join(result['predict'])}"
             + (" (curves fitted)" if result["curves"] else "")]
    head = f"{'figure':9s} {'category':9s} {'predicted':>9s} {'band 10-90%':>13s} {'in':>3s} {'actual':>7s} " \
           f"{'error':>7s}  samples alone: predicted, band, in, error"
    lines.append(head)
    for figure, fig in result["figures"].items():
        for cat, row in [*fig["categories"].items(), ("weighted", fig.get("weighted"))]:
            if row is None:
                continue
            lo, hi = row["band"]
            old = row.get("samples_alone")
            tail = (f"{old['predicted']:.3f}, {old['band'][0]:.3f}-{old['band'][1]:.3f}, "
                    f"{'yes' if old['band_holds_actual'] else 'no'}, {old['error']:+.1%}" if old else "-")
            lines.append(f"{figure:9s} {cat:9s} {row['predicted']:9.3f} {lo:6.3f}-{hi:6.3f} "
                         f"{'yes' if row['band_holds_actual'] else 'no':>3s} {row['actual']:7.3f} {row['error']:+7.1%}  {tail}")
        if fig["skipped"]:
            lines.append(f"{figure}: skipped {len(fig['skipped'])} point(s): {fig['skipped'][0]}")
    lines.append(f"R* (both figures): {json.dumps(result['r_star'])}")
    for figure, fig in result["figures"].items():
        w = fig.get("weighted")
        if not w:
            lines.append(f"{figure}: not checked: the JSON lacks this figure for the small or the large drafts")
        else:
            ok = w["within_5_percent"] and w["band_holds_actual"]
            lines.append(f"{figure}: {'met' if ok else 'missed'}: weighted error {w['error']:+.1%}, "
                         f"band {'holds' if w['band_holds_actual'] else 'misses'} the actual")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a bench/reference_multidomain/run.py JSON")
    p.add_argument("--fit-max", type=int, default=2000, help="fit on the matched drafts of at most this many samples")
    p.add_argument("--predict", type=int, default=None, help="the matched draft size to predict (default: the largest)")
    p.add_argument("--curves", action="store_true", help="also fit each small draft's per-epoch curve (simulated)")
    p.add_argument("--json", type=Path, default=None, help="write the check here")
    args = p.parse_args(argv)
    try:
        saved = json.loads(args.results.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{args.results}: cannot read it: {exc}") from None
    result = check(saved, args.fit_max, args.predict, args.curves)
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
