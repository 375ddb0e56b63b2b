"""`curator eval --profile`: acceptance per traffic category and weighted by the traffic's shares,
for the measured and the simulated figures, each prompt category counted as the mix recorded it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import toy_corpus
from curator.traffic.schema import Profile
from curator.evaluation.weighting import eval_weights
from curator.scout.briefs import load_briefs
from curator.scout.traffic_shares import served_map
from curator.rows.schema import MANIFEST
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


def write_profile(path: Path, shares: dict[str, float]) -> Path:
    path.write_text(json.dumps(Profile(categories={c: {"share": s, "rows": int(s * 10)} for c, s in shares.items()})
                               .model_dump(mode="json")))
    return path


def record_serves(mix: Path, serves: dict[str, str | None]) -> Path:
    """Give a written mix's manifest the category map build-mix records."""
    manifest = mix / MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "serves": serves}))
    return mix


def write_brief(folder: Path, category: str, traffic: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{category}.md").write_text(f"---\nid: {category}\ntitle: {category}\ncategory: {category}\n"
                                           f"traffic: {traffic}\nseed_queries: [x]\ngood_find: x\n---\nbody\n")
    return folder


def test_the_category_map_is_the_mixs_and_briefs_at_eval_time_change_nothing(tmp_path: Path, monkeypatch) -> None:
    rows = [{"id": f"m{i}", "category": c, "messages": [{"role": "user", "content": f"hello {i}"}]}
            for i, c in enumerate(["coding", "chat", "writing"])]
    mix = record_serves(write_mix(tmp_path / "mix", rows), {"coding": "code", "chat": "chat", "writing": None})
    profile = write_profile(tmp_path / "p.json", {"agentic": 0.0, "code": 0.5, "reasoning": 0.0, "chat": 0.5})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CURATOR_AGENTS_DIR", str(tmp_path / "no-agents"))  # no briefs anywhere
    weights = eval_weights(profile, mix)
    assert weights.groups == {"coding": "code", "chat": "chat"} and weights.recorded == str(mix / MANIFEST)
    # briefs that map otherwise, present when the eval runs: the mix's record still decides
    monkeypatch.setenv("CURATOR_AGENTS_DIR", str(write_brief(tmp_path / "agents", "coding", "chat")))
    write_brief(tmp_path / "agents", "writing", "chat")
    assert served_map(load_briefs()) == {"coding": "chat", "writing": "chat"}  # valid briefs that disagree
    assert eval_weights(profile, mix) == weights
    result = traffic_weighted({"coding": stats([3]), "writing": stats([0])}, weights.shares, weights.groups)
    assert result["categories"]["code"]["forwards"] == 1 and result["unweighted"] == ["writing"]


def test_a_mix_without_a_recorded_map_counts_categories_by_their_names_and_says_so(tmp_path: Path, monkeypatch,
                                                                                 capsys) -> None:
    import training.eval.evaluate as evaluate_module
    import training.drafts.registry as registry
    from curator.evaluation.measure import measure

    mix = write_mix(tmp_path / "mix", [{"id": "a", "category": "coding", "messages": [{"role": "user", "content": "x"}]}])
    profile = write_profile(tmp_path / "p.json", {"agentic": 0.0, "code": 1.0, "reasoning": 0.0, "chat": 0.0})
    for prompts in (mix, None):  # an old mix; prompts from a file
        weights = eval_weights(profile, prompts)
        assert weights.groups == {} and weights.recorded is None
    report = type("Report", (), {"categories": {"coding": stats([2]), "code": stats([1])}, "traffic": None})()
    monkeypatch.setattr(evaluate_module, "evaluate", lambda *args, **kwargs: report)  # no decoding: the weighting only
    monkeypatch.setattr(registry, "kind_of_model", lambda draft: SimpleNamespace(proposer=lambda *args: None))
    measure(None, None, None, [], steps=STEPS, max_new_tokens=1, tie_margin=0.0, weights=weights)
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("record no category map") == 1 and "of its name only" in err
    assert report.traffic["unweighted"] == ["coding"] and report.traffic["categories"]["code"]["forwards"] == 1


def test_cli_eval_reports_the_traffic_weighted_acceptance_measured_and_simulated(target, tiny_target: Path, tmp_path: Path,
                                                                                capsys, monkeypatch) -> None:
    from curator.cli import main

    model, tokenizer = target
    store = write_store(model, tokenizer, tmp_path / "store", n=4)  # every sample is "code"
    export = export_random_draft(model, tiny_target, tmp_path, store=store, eval_fraction=0.5)
    rows = [{"id": f"m{i}", "source": "toy", "category": ["agentic", "coding", "chat"][i % 3],
             "messages": [{"role": "user", "content": line}], "turns": "all", "keep_responses": False}
            for i, line in enumerate(toy_corpus(6, seed=11))]
    # the map build-mix records; no briefs folder when the eval runs
    mix = record_serves(write_mix(tmp_path / "mix", rows), {"agentic": "agentic", "coding": "code", "chat": "chat"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CURATOR_AGENTS_DIR", str(tmp_path / "no-agents"))
    profile = write_profile(tmp_path / "traffic.json", {"agentic": 0.5, "code": 0.3, "reasoning": 0.2, "chat": 0.0})
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
    assert "record no category map" not in " ".join(err.split())
