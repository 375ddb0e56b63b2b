"""The fair redo of the multi-domain proof (bench/reference_multidomain/fair.py), at toy sizes on the
CPU: the code, never the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.reference_multidomain.curate import _recipe
from bench.reference_multidomain.fair import ARM_RECIPES, efficiency, findings, main, recipe_shares, spread


def test_the_arms_shares_are_the_named_recipes_samples_per_category() -> None:
    generic = recipe_shares(ARM_RECIPES["generic"])
    assert generic == {"chat": 1.0}  # ShareGPT + UltraChat: every source is chat
    hand = recipe_shares(ARM_RECIPES["hand"])
    assert set(hand) == {"agentic", "code", "reasoning", "chat"}
    assert hand["agentic"] == pytest.approx(22800 / 97800) and hand["code"] == pytest.approx(25000 / 97800)


def test_a_recipe_with_shares_leaves_out_the_categories_without_one(tmp_path: Path) -> None:
    files = {c: tmp_path / f"{c}.jsonl" for c in ("code", "chat", "agentic", "reasoning")}
    only_chat = _recipe(files, tmp_path, "g", 100, tmp_path / "held.jsonl", {"chat": 1.0})
    assert [(s["category"], s["samples"]) for s in only_chat["sources"]] == [("chat", 100)]
    split = _recipe(files, tmp_path, "h", 101, tmp_path / "held.jsonl", {"code": 0.5, "chat": 0.25, "agentic": 0.25})
    assert sum(s["samples"] for s in split["sources"]) == 101 and len(split["sources"]) == 3
    uniform = _recipe(files, tmp_path, "u", 60, tmp_path / "held.jsonl")  # the old behaviour: by domain
    assert {s["category"]: s["samples"] for s in uniform["sources"]} == {"code": 30, "chat": 10, "agentic": 10,
                                                                        "reasoning": 10}
    yaml.safe_dump(split)


def test_efficiency_reads_each_arm_s_log_linear_curve_both_ways() -> None:
    cell = lambda v: {"mean": v, "n": 3}  # noqa: E731
    table = {"matched": {2: cell(2.3), 8: cell(2.5)}, "generic": {2: cell(2.0), 8: cell(2.2)},
             "hand": {2: cell(2.4), 8: cell(2.4)}}
    out = efficiency(table, 2, 8)
    # the generic curve gains 0.2 per 4x: 2.3 needs 4 ** 1.5 = 8x the small size, past its large size
    assert out["generic"]["ratio"] == pytest.approx(8.0, rel=1e-3) and out["generic"]["extrapolated"]
    # the matched curve reaches the generic 8K figure (2.2) below 2K: ratio at large = 8 / that
    assert out["generic"]["ratio_at_large"] == pytest.approx(8 / (2 * 4 ** -0.5), rel=1e-3)
    assert out["hand"]["ratio"] is None and "does not rise" in out["hand"]["why"]
    assert spread([1.0, 2.0, 3.0]) == {"mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0, "n": 3}


@pytest.mark.slow
def test_fair_runs_at_toy_size_and_keeps_the_forecast_s_format(tmp_path: Path) -> None:
    out = tmp_path / "fair.json"
    assert main(["--tiny", "--workdir", str(tmp_path / "w"), "--out", str(out), "--device", "cpu",
                 "--target-steps", "3", "--workers", "2", "--variants", "fc_norm"]) == 0
    results = json.loads(out.read_text())
    assert "partial" not in results and not results["skipped"]
    drafts = results["drafts"]
    cells = {(r["arm"], r["size"], r["seed"]) for r in drafts.values() if r["fraction"] == 1 and not r["variant"]}
    assert cells == {(a, n, s) for a in ("generic", "hand", "matched") for n in (24, 48) for s in (0, 1)}
    assert {"matched-24-x0.5-s0", "matched-24+fc_norm-s0", "matched-48+fc_norm-s0"} <= set(drafts)
    assert results["mixes"]["generic-48"]["domains"] == {"prose": 48}  # the EAGLE-3 blend: all chat
    keys = {"samples", "category_samples", "train_steps", "measured", "measured_weighted", "simulated",
            "simulated_weighted", "eval_prompts", "arm", "seed", "epochs", "batch_size", "stopped_at_epoch", "curve"}
    for row in drafts.values():
        assert keys <= set(row) and row["measured"] and row["greedy_cached"]
        assert [e["epoch"] for e in row["curve"]] == [1.0, 2.0] and row["epochs"] == 2
        assert row["curve"][-1]["steps"] == row["train_steps"] and row["curve"][-1]["simulated"] == row["simulated"]
        assert row["curve"][-1]["sequences"] == row["train_steps"] * row["batch_size"]
        assert row["stopped_at_epoch"] in (1.0, 2.0) and row["best"]["measured_weighted"] is not None
        kept = sorted(p.name for p in (tmp_path / "w" / f"run-{next(t for t, r in drafts.items() if r is row)}"
                                       / "checkpoints").glob("step-*"))
        assert 1 <= len(kept) <= 2  # the last and the best epoch's, nothing else
    f = results["findings"]
    assert set(f["measured_end"]["cells"]) == {"generic", "hand", "matched"}
    assert f["simulated_end"]["cells"]["matched"]["48"]["n"] == 2
    assert set(f["variants"]["24"]) == {"plain", "fc_norm"}
    again = findings(drafts, results["settings"])
    assert again["simulated_best"] == f["simulated_best"]
    assert main(["--findings-from", str(out)]) == 0


def test_combine_pools_runs_of_one_set_up_and_refuses_another(tmp_path: Path) -> None:
    from bench.reference_multidomain.fair import combine

    def run(name: str, sha: str, drafts: dict) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({
            "settings": {"sizes": [2, 8], "seeds": [0], "arms": ["matched"]}, "target": {"weights_sha256": sha},
            "profile": {"shares": {"code": 1.0}}, "data": {"pool": 1}, "mixes": {"matched-2": {"domains": {"python": 2}}},
            "drafts": drafts, "skipped": {"train:matched-2-s1": "not started"}}))
        return str(path)

    row = lambda seed, v: {"arm": "matched", "size": 2, "seed": seed, "fraction": 1.0, "variant": None,  # noqa: E731
                           "simulated_weighted": v, "measured_weighted": None, "stopped_at_epoch": 1.0,
                           "best": {"simulated_weighted": v}}
    a = run("a.json", "x", {"matched-2-s0": row(0, 2.0)})
    b = run("b.json", "x", {"matched-2-s1": row(1, 2.2)})
    out = combine([a, b])
    assert out["settings"]["seeds"] == [0, 1] and out["drafts"]["matched-2-s1"]["run"] == "b.json"
    assert out["findings"]["simulated_end"]["cells"]["matched"]["2"]["mean"] == pytest.approx(2.1)
    assert "a.json:train:matched-2-s1" not in out["skipped"]  # trained by the other run
    with pytest.raises(SystemExit, match="not the same set-up"):
        combine([a, run("c.json", "y", {"matched-2-s2": row(2, 2.0)})])
