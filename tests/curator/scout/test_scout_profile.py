"""`curator scout --profile`: the agents and the proposal's quotas follow the traffic's shares."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml

from curator.cli import main
from curator.errors import ConfigError
from curator.mix import load_recipe
from curator.scout.briefs import load_briefs, parse_brief
from curator.scout.traffic_shares import TrafficShares, served_by, served_map, take_for_traffic, traffic_category
from curator.traffic.schema import Profile, serves

AGENTS_DIR = Path(__file__).resolve().parents[3] / "agents"
SHARES = {"agentic": 0.0, "code": 0.5, "reasoning": 0.2, "chat": 0.3}


def write_profile(path: Path, shares: dict[str, float]) -> Path:
    profile = Profile(categories={c: {"share": s, "rows": round(s * 1000)} for c, s in shares.items()})
    path.write_text(json.dumps(profile.model_dump(mode="json")))
    return path


def test_every_shipped_brief_serves_a_traffic_category() -> None:
    served = {b.id: traffic_category(b) for b in load_briefs(AGENTS_DIR)}
    assert None not in served.values()
    assert served["agentic-trajectories"] == "agentic" and served["code-review-debugging"] == "code"
    assert served["reasoning-math"] == "reasoning" and served["general-chat"] == "chat"


def test_the_serving_rule_is_one_function_on_plain_values() -> None:
    assert serves("coding", ["code", "code", None]) == "code"
    assert serves("coding", ["code", "chat"]) is None and serves("general", [None]) is None
    assert serves("chat", ["code", "chat"]) == "chat" and serves("chat") == "chat"  # disagreeing: its own name
    briefs = load_briefs(AGENTS_DIR)
    assert {b.category: served_by(b.category, briefs) for b in briefs} == served_map(briefs)
    assert served_map(briefs)["writing"] == "chat" and served_map(briefs)["agentic"] == "agentic"


def test_agents_are_shared_among_categories_by_the_traffic_shares() -> None:
    briefs = load_briefs(AGENTS_DIR)
    chosen, counts, notes = take_for_traffic(briefs, 5, TrafficShares("p.json", {k: v for k, v in SHARES.items() if v}))
    by_category = Counter(traffic_category(b) for b in chosen)
    assert counts == {"code": 3, "reasoning": 1, "chat": 1} and by_category == counts
    # heaviest briefs first within a category, and no agent for the traffic's absent agentic share
    assert {b.id for b in chosen} == {"coding-instructions", "code-review-debugging", "multi-language-code",
                                      "reasoning-math", "general-chat"}
    assert notes == []
    # without --agents every brief that serves the traffic runs; the agentic one does not
    everyone, _, notes = take_for_traffic(briefs, None, TrafficShares("p.json", {k: v for k, v in SHARES.items() if v}))
    assert len(everyone) == 9 and "agentic-trajectories" not in {b.id for b in everyone}
    assert notes == ["9 of 10 agents: only that many briefs serve the traffic's categories"]


def test_a_traffic_category_no_brief_serves_is_reported(tmp_path: Path) -> None:
    for brief in AGENTS_DIR.glob("*.md"):
        if brief.name != "agentic-trajectories.md":
            shutil.copy(brief, tmp_path / brief.name)
    _, counts, notes = take_for_traffic(load_briefs(tmp_path), 4, TrafficShares("p.json", {"agentic": 0.5, "chat": 0.5}))
    assert counts == {"agentic": 0, "chat": 4}
    assert any("agentic share (50.0%) has no brief serving it" in n for n in notes)


def test_a_brief_naming_an_unknown_traffic_category_is_refused() -> None:
    text = (AGENTS_DIR / "general-chat.md").read_text().replace("traffic: chat", "traffic: poetry")
    with pytest.raises(ConfigError, match="general-chat.md: traffic: .*must be one of agentic, code, reasoning, chat"):
        parse_brief(text, Path("general-chat.md"))


def test_scout_with_a_profile_proposes_quotas_in_the_traffic_shares(tmp_path: Path, capsys) -> None:
    profile = write_profile(tmp_path / "traffic-profile.json", SHARES)
    recipe = tmp_path / "proposed.yaml"
    code = main(["scout", "--planner", "rules", "--hub", "bundled", "--agents", "5", "--profile", str(profile),
                 "--catalog", str(tmp_path / "c.duckdb"), "--recipe-out", str(recipe), "--no-live",
                 "--target-samples", "10000", "--agents-dir", str(AGENTS_DIR)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "agents by traffic (traffic-profile.json): code 3, reasoning 1, chat 1" in err
    briefs = {b.category: traffic_category(b) for b in load_briefs(AGENTS_DIR)}
    sources = yaml.safe_load(recipe.read_text())["sources"]
    per_traffic = Counter()
    for source in sources:
        per_traffic[briefs[source["category"]]] += source["samples"]
        # a brief category serving another one says so, for the mix to record (and `eval --profile` to read back)
        assert source.get("traffic") == (briefs[source["category"]] if briefs[source["category"]] != source["category"]
                                         else None)
    assert per_traffic == {"code": 5000, "reasoning": 2000, "chat": 3000}
    assert any("traffic" in source for source in sources)
    assert load_recipe(recipe).served_categories() == {s["category"]: briefs[s["category"]] for s in sources}
    quota_comments = [line for line in recipe.read_text().splitlines() if line.strip().startswith("# ") and "relevance" in line]
    assert len(quota_comments) == len(sources)
    assert all("(traffic profile traffic-profile.json)" in line for line in quota_comments)


def test_a_profile_the_proposal_cannot_follow_is_one_clear_error(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.json"
    code = main(["scout", "--planner", "rules", "--hub", "bundled", "--profile", str(missing),
                 "--catalog", str(tmp_path / "c.duckdb"), "--no-live", "--agents-dir", str(AGENTS_DIR)])
    err = capsys.readouterr().err
    assert code == 1 and "no such profile" in err and "Traceback" not in err
    assert not (tmp_path / "c.duckdb").exists()


def test_a_category_short_of_rows_leaves_its_remainder_inside_its_traffic_category() -> None:
    from curator.scout.proposal import MergedCandidate, propose_mix

    def found(dataset_id: str, category: str, rows: int | None) -> MergedCandidate:
        return MergedCandidate(dataset_id, category, 0.8, ["a"], 1, [("a", 0.8, "fits")], 100, "mit", rows)

    merged = [found("o/swe-gym", "debugging", 500), found("o/code", "coding", None),
              found("o/chat", "chat", None), found("o/math", "reasoning", None)]
    traffic = TrafficShares("p.json", {"code": 0.5, "reasoning": 0.2, "chat": 0.3})
    proposal = propose_mix(merged, load_briefs(AGENTS_DIR), "any goal", 10_000, traffic=traffic)
    samples = {q.dataset_id: q.samples for q in proposal.quotas}
    # debugging holds 500 rows: the code share's other 4,500 go to coding, not to chat or reasoning
    assert samples == {"o/swe-gym": 500, "o/code": 4500, "o/math": 2000, "o/chat": 3000}
