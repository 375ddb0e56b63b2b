"""bench/reference_multidomain/forecast_check.py on reference JSONs made here from a known law: the
budget-aware forecast predicts the large draft where a fit on samples alone misses it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.reference_multidomain import forecast_check as check
from curator import forecast as fc

K = 4
SHARES = {"code": 0.55, "agentic": 0.25, "reasoning": 0.12, "chat": 0.08}
# the truth: saturating in Muennighoff's effective data with R* = 12, per category (a, b)
TRUTH = {"code": (-3.6, 0.28), "agentic": (-0.9, 0.33), "reasoning": (-2.2, 0.30), "chat": (-3.9, 0.26)}
WIGGLE = (0.004, -0.006, 0.005, -0.003, 0.002)


def truth(cat: str, n: float, epochs: float) -> float:
    a, b = TRUTH[cat]
    d = float(fc.effective_samples(n, epochs, 12.0))
    return 1 + K / (1 + math.exp(-(a + b * math.log(d))))


def reference(tmp_path: Path, *, sequences: float | None = None, epochs: float | None = None,
              old_layout: bool = False) -> Path:
    """Write a run.py-shaped JSON: the matched arm at 1/8, 1/4, 1/2 and the whole 2K mix and 8K;
    each trained `sequences` sequences (a fixed step budget) or `epochs` epochs, with its curve."""
    drafts = {}
    for i, total in enumerate((250, 500, 1000, 2000, 8000)):
        counts = {c: round(total * s) for c, s in SHARES.items()}
        ep = sequences / total if sequences else epochs
        sim = {c: round(truth(c, counts[c], ep) + WIGGLE[i], 4) for c in SHARES}
        meas = {c: round(v + (0.03 if (i + j) % 2 else -0.03), 4) for j, (c, v) in enumerate(sim.items())}
        row = {"samples": total, "category_samples": counts, "measured": meas, "simulated": sim,
               "measured_weighted": sum(meas[c] * s for c, s in SHARES.items()),
               "simulated_weighted": sum(sim[c] * s for c, s in SHARES.items())}
        if old_layout:
            row["train_steps"] = 300
        else:
            whole = math.ceil(ep)
            curve = [{"epoch": e, "steps": round(e * total / 64), "sequences": e * total,
                      "simulated": {c: round(truth(c, counts[c], e) - 0.05, 4) for c in SHARES},
                      "simulated_weighted": 0.0} for e in range(1, whole)]
            curve.append({"epoch": whole, "steps": round(ep * total / 64), "sequences": ep * total, "simulated": sim,
                          "simulated_weighted": row["simulated_weighted"]})
            row |= {"arm": "matched", "seed": 0, "epochs": whole, "batch_size": 64, "stopped_at_epoch": None,
                    "train_steps": round(ep * total / 64), "curve": curve}
        tag = "matched-8000" if total == 8000 else ("matched-2000" if total == 2000 else f"matched-2000-x{total / 2000:g}")
        drafts[tag] = row
    # another arm's drafts never enter the matched fit
    drafts["generic-2000"] = {**drafts["matched-2000"], "arm": "generic", "simulated": {c: 1.1 for c in SHARES}}
    if old_layout:
        drafts["generic-2000"].pop("arm")
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({"settings": {"ttt_steps": K, "batch": 64}, "profile": {"shares": SHARES},
                                "categories": {}, "drafts": drafts}))
    return path


def test_at_a_fixed_step_budget_the_forecast_holds_where_samples_alone_overshoots(tmp_path: Path) -> None:
    # 300 steps of 64, as the 2026-12-01 run: the 8K draft sees 2.4 epochs, the 2K one 9.6
    saved = json.loads(reference(tmp_path, sequences=300 * 64, old_layout=True).read_text())
    result = check.check(saved)
    assert result["predict"] == ["matched-8000"] and "generic-2000" not in result["fit_from"]
    for figure in check.FIGURES:
        w = result["figures"][figure]["weighted"]
        assert abs(w["error"]) <= 0.05 and w["band_holds_actual"], (figure, w)
        # the law on samples alone does not see that the 8K draft repeats its samples far less: it
        # overshoots, and its band (the scatter about its line) misses, as on the 2026-12-01 run
        assert w["samples_alone"]["error"] > 0.04 and not w["samples_alone"]["band_holds_actual"], (figure, w)
    # the budget comes from train_steps x the settings' batch
    assert result["figures"]["simulated"]["categories"]["code"]["epochs"] == pytest.approx(2.4)


def test_drafts_at_equal_epochs_with_curves_are_read_at_the_curve_point_they_report(tmp_path: Path) -> None:
    saved = json.loads(reference(tmp_path, epochs=3.0).read_text())
    big = saved["drafts"]["matched-8000"]
    assert check.draft_epochs(big, saved["settings"]) == pytest.approx(3.0)
    # a draft kept at its best held-out epoch: the curve point holding its figure sets its budget
    best = {**big, "curve": [{**p, "simulated_weighted": big["simulated_weighted"] if p["epoch"] == 2 else 0.0,
                              "sequences": p["epoch"] * 8000} for p in big["curve"]]}
    assert check.draft_epochs(best, saved["settings"]) == pytest.approx(2.0)
    for curves in (False, True):
        result = check.check(saved, curves=curves)
        for figure in check.FIGURES:
            w = result["figures"][figure]["weighted"]
            assert abs(w["error"]) <= 0.05 and w["band_holds_actual"], (curves, figure, w)


def test_fair_py_s_layout_seeds_variants_and_unmeasured_drafts(tmp_path: Path) -> None:
    """fair.py's JSON: several seeds per cell, EAGLE-3.1 variants beside the plain drafts, the measured
    figure missing on some drafts, `stopped_at_epoch` holding the best epoch, not the last."""
    saved = json.loads(reference(tmp_path, epochs=3.0).read_text())
    drafts = saved["drafts"]
    for tag in list(drafts):
        row = drafts[tag]
        if row.get("arm") != "matched":
            continue
        row["stopped_at_epoch"] = 1  # the best held-out epoch: the figures are still the last epoch's
        other = json.loads(json.dumps(row)) | {"seed": 1}
        other["simulated"] = {c: round(v + 0.004, 4) for c, v in row["simulated"].items()}
        other["simulated_weighted"] = sum(other["simulated"][c] * s for c, s in SHARES.items())
        other["curve"][-1] |= {"simulated": other["simulated"], "simulated_weighted": other["simulated_weighted"]}
        other |= {"measured": {}, "measured_weighted": None}
        drafts[f"{tag}-seed1"] = other
        drafts[f"{tag}-norms"] = row | {"variant": "norms", "simulated": {c: 1.05 for c in SHARES}}
    result = check.check(saved)
    assert not any(t.endswith("-norms") for t in result["fit_from"] + result["predict"])
    assert result["predict"] == ["matched-8000", "matched-8000-seed1"]
    sim, meas = result["figures"]["simulated"], result["figures"]["measured"]
    assert sim["categories"]["code"]["points"] == 8 and meas["categories"]["code"]["points"] == 4
    assert sim["categories"]["code"]["epochs"] == pytest.approx(3.0)
    big = drafts["matched-8000"]
    assert sim["categories"]["code"]["actual"] == pytest.approx(big["simulated"]["code"] + 0.002, abs=1e-4)
    assert meas["categories"]["code"]["actual"] == pytest.approx(big["measured"]["code"])
    for w in (sim["weighted"], meas["weighted"]):
        assert abs(w["error"]) <= 0.05 and w["band_holds_actual"], w


def test_an_impossible_figure_in_a_small_draft_is_a_counted_skip(tmp_path: Path) -> None:
    saved = json.loads(reference(tmp_path, sequences=300 * 64, old_layout=True).read_text())
    saved["drafts"]["matched-2000-x0.25"]["simulated"]["chat"] = float("nan")
    saved["drafts"]["matched-2000-x0.5"]["simulated"]["code"] = 1e308
    sim = check.check(saved)["figures"]["simulated"]
    assert len(sim["skipped"]) == 2 and "impossible" in sim["skipped"][0]
    assert sim["categories"]["chat"]["points"] == 3 and sim["categories"]["agentic"]["points"] == 4


def test_the_command_prints_every_figure_and_writes_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = reference(tmp_path, sequences=300 * 64)
    assert check.main([str(path), "--json", str(tmp_path / "check.json")]) == 0
    shown = capsys.readouterr().out
    assert "measured: met" in shown and "simulated: met" in shown and "R* (both figures)" in shown
    written = json.loads((tmp_path / "check.json").read_text())
    assert set(written["figures"]) == {"measured", "simulated"}
    assert set(written["figures"]["simulated"]["categories"]) == set(SHARES)
