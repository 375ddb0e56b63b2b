"""`curator eval --profile`: acceptance per traffic category and weighted by the traffic's shares,
for the measured and the simulated figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import toy_corpus
from curator.traffic.schema import Profile
from curator.evaluation.weighting import brief_groups
from tests.training.eval.test_evaluate import STEPS, export_random_draft, write_mix, write_store
from training.eval.simulate import AcceptanceStats, traffic_weighted


def stats(accepted: list[int]) -> AcceptanceStats:
    out = AcceptanceStats(STEPS)
    out.add(accepted)
    return out


def test_weights_are_the_shares_renormalised_over_the_categories_measured() -> None:
    categories = {"coding": stats([3, 3]), "debugging": stats([1, 1]), "chat": stats([0, 0, 0, 0]), "misc": stats([2])}
    shares = {"agentic": 0.1, "code": 0.6, "reasoning": 0.1, "chat": 0.2}
    result = traffic_weighted(categories, shares, {"coding": "code", "debugging": "code"})
    # code pools coding and debugging: 1 + 8/4 = 3.0; chat 1.0; weights 0.6 and 0.2 renormalised to 0.75 and 0.25
    assert result["categories"]["code"] == {"share": 0.6, "weight": pytest.approx(0.75), "forwards": 4,
                                            "acceptance_length": 3.0}
    assert result["categories"]["chat"]["weight"] == pytest.approx(0.25) and result["categories"]["chat"]["acceptance_length"] == 1.0
    assert result["acceptance_length"] == pytest.approx(0.75 * 3.0 + 0.25 * 1.0)
    assert result["missing"] == ["agentic", "reasoning"] and result["unweighted"] == ["misc"]
    assert math.isnan(result["categories"]["agentic"]["acceptance_length"])


def test_nothing_measured_in_the_traffic_categories_gives_no_total() -> None:
    result = traffic_weighted({"misc": stats([1])}, {"code": 1.0})
    assert math.isnan(result["acceptance_length"]) and result["missing"] == ["code"] and result["unweighted"] == ["misc"]


def test_scouted_categories_count_for_the_traffic_category_their_brief_serves() -> None:
    groups = brief_groups(Path(__file__).resolve().parents[3] / "agents")
    assert groups["coding"] == groups["debugging"] == groups["multilingual-code"] == "code"
    assert groups["writing"] == "chat" and "agentic" not in groups  # a traffic category's own name stands for itself


def test_cli_eval_reports_the_traffic_weighted_acceptance_measured_and_simulated(target, tiny_target: Path, tmp_path: Path,
                                                                                capsys) -> None:
    from curator.cli import main

    model, tokenizer = target
    store = write_store(model, tokenizer, tmp_path / "store", n=4)  # every sample is "code"
    export = export_random_draft(model, tiny_target, tmp_path, store=store, eval_fraction=0.5)
    rows = [{"id": f"m{i}", "source": "toy", "category": ["agentic", "coding", "chat"][i % 3],
             "messages": [{"role": "user", "content": line}], "turns": "all", "keep_responses": False}
            for i, line in enumerate(toy_corpus(6, seed=11))]
    mix = write_mix(tmp_path / "mix", rows)
    shares = {"agentic": 0.5, "code": 0.3, "reasoning": 0.2, "chat": 0.0}
    profile = tmp_path / "traffic.json"
    profile.write_text(json.dumps(Profile(categories={c: {"share": s, "rows": int(s * 10)} for c, s in shares.items()})
                                  .model_dump(mode="json")))
    out = tmp_path / "eval.json"
    code = main(["eval", "--model", str(tiny_target), "--draft", str(export), "--prompts", str(mix), "--steps", str(STEPS),
                 "--max-new-tokens", "6", "--data", str(store), "--device", "cpu", "--json", str(out),
                 "--profile", str(profile)])
    err = capsys.readouterr().err
    assert code == 0, err
    report = json.loads(out.read_text())
    measured = report["traffic_weighted"]
    per = report["categories"]
    # agentic 0.5 and code 0.3 (the "coding" prompts) measured: weights 0.625 and 0.375; reasoning has no prompts
    expected = 0.625 * per["agentic"]["acceptance_length"] + 0.375 * per["coding"]["acceptance_length"]
    assert measured["acceptance_length"] == pytest.approx(expected)
    assert measured["categories"]["code"]["weight"] == pytest.approx(0.375)
    assert measured["missing"] == ["reasoning"] and measured["unweighted"] == []
    assert measured["categories"]["chat"]["weight"] == 0.0 and measured["categories"]["chat"]["forwards"] > 0
    simulated = report["offline_estimate"]["traffic_weighted"]
    assert simulated["missing"] == ["agentic", "reasoning"]
    assert simulated["acceptance_length"] == pytest.approx(report["offline_estimate"]["simulated"]["categories"]["code"]["acceptance_length"])
    assert report["profile"] == str(profile)
    assert "acceptance length on the traffic (profile traffic.json)" in err
    assert "measured: no prompts for reasoning; weights renormalised over the rest" in err
