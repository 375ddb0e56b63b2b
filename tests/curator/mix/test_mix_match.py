"""build-mix --match: category totals rescaled to the traffic's shares, traffic-like rows preferred inside
a category, remainders handed over, and a profile that shares no category with the recipe refused."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from curator.cli import main
from curator.mix import build_mix, recipe_from_dict
from curator.mix.match import largest_remainder
from curator.traffic.features import BUCKETS, FEATURE_METHOD, distribution
from curator.traffic.schema import PROFILE_KIND, PROFILE_VERSION
from training.errors import ConfigFileError

CODE_WORDS = "rust borrow checker lifetime trait struct impl vector iterator closure compile cargo crate".split()
COOKING_WORDS = "oven bake flour sugar butter whisk simmer garlic onion roast pepper salt dough".split()
CHAT_WORDS = "weekend holiday friends movie birthday travel weather music garden letter poem story".split()


def _texts(words: list[str], n: int, seed: int, length: int = 30) -> list[str]:
    rng = random.Random(seed)
    return [f"request {seed}-{i}: " + " ".join(rng.choice(words) for _ in range(length)) for i in range(n)]


def _jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i:04d}", "instruction": p, "response": "ok"}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def write_profile(path: Path, shares: dict[str, float], texts: dict[str, list[str]]) -> Path:
    """Write a profile as `curator profile` does: shares, and per category the hashed features of its user texts."""
    per_category = {}
    for cat, cat_texts in texts.items():
        dense = distribution(cat_texts)
        nz = np.flatnonzero(dense)
        per_category[cat] = {"indices": nz.tolist(), "counts": dense[nz].tolist()}
    data = {"kind": PROFILE_KIND, "version": PROFILE_VERSION,
            "categories": {c: {"share": s, "rows": int(1000 * s)} for c, s in shares.items()},
            "features": {"method": FEATURE_METHOD, "buckets": BUCKETS, "per_category": per_category}}
    path.write_text(json.dumps(data))
    return path


def _kept_by_category(manifest: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for source in manifest["sources"]:
        for cat, c in source["categories"].items():
            out[cat] = out.get(cat, 0) + c["kept"]
    return out


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    _jsonl(tmp_path / "chat.jsonl", _texts(CHAT_WORDS, 150, 1))
    _jsonl(tmp_path / "code.jsonl", _texts(CODE_WORDS, 150, 2))
    return tmp_path


def test_matched_shares_are_the_traffics_to_rounding_and_a_missing_category_is_reported(folder: Path) -> None:
    shares = {"code": 0.6, "chat": 0.25, "reasoning": 0.15}  # the recipe has no reasoning source
    profile = write_profile(folder / "p.json", shares, {"code": _texts(CODE_WORDS, 50, 9), "chat": _texts(CHAT_WORDS, 50, 8)})
    recipe = recipe_from_dict({"name": "m", "seed": 3, "sources": [
        {"path": str(folder / "chat.jsonl"), "name": "chat", "samples": 70, "category": "chat"},
        {"path": str(folder / "code.jsonl"), "name": "code", "samples": 31, "category": "code"}]})
    manifest = build_mix(recipe, folder / "mix", match=profile)
    # 101 rows shared 0.6 : 0.25 over the categories both have: 71.29 and 29.71 -> 71 and 30.
    assert _kept_by_category(manifest) == {"code": 71, "chat": 30} == dict(zip(["code", "chat"], largest_remainder([0.6, 0.25], 101)))
    match = manifest["match"]
    assert match["not_in_recipe"] == {"reasoning": 0.15}
    assert match["method"] == "dsir-importance-gumbel-top-k"
    for cat in ("code", "chat"):
        c = match["categories"][cat]
        assert c["target"] == c["kept"] and abs(c["achieved_share"] - c["target_share"]) < 1 / 101


def test_importance_prefers_traffic_like_rows_inside_a_mixed_source(tmp_path: Path) -> None:
    code_like, cooking = _texts(CODE_WORDS, 100, 4), _texts(COOKING_WORDS, 100, 5)
    mixed = [p for pair in zip(code_like, cooking) for p in pair]  # one source, half each, interleaved
    _jsonl(tmp_path / "mixed.jsonl", mixed)
    profile = write_profile(tmp_path / "p.json", {"code": 1.0}, {"code": _texts(CODE_WORDS, 80, 11)})
    recipe = recipe_from_dict({"name": "m", "sources": [
        {"path": str(tmp_path / "mixed.jsonl"), "name": "mixed", "samples": 40, "category": "code"}],
        "dedup": {"exact": True, "near": False}})
    import pyarrow.parquet as pq

    def kept_code_like(out: Path, **kw: object) -> int:
        build_mix(recipe, out, **kw)
        rows = pq.read_table(sorted(out.glob("*.parquet"))).to_pylist()
        assert len(rows) == 40
        return sum(any(w in r["messages"][0]["content"].split() for w in CODE_WORDS) for r in rows)

    assert kept_code_like(tmp_path / "matched", match=profile) >= 38
    assert kept_code_like(tmp_path / "plain") <= 30  # the seeded uniform sample takes about half
    again = tmp_path / "again"
    build_mix(recipe, again, match=profile)  # deterministic for the seed
    first = sorted((tmp_path / "matched").glob("*.parquet"))
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in sorted(again.glob("*.parquet"))]


def test_a_short_source_gives_its_remainder_to_its_category(folder: Path) -> None:
    _jsonl(folder / "few.jsonl", _texts(CODE_WORDS, 10, 7))
    profile = write_profile(folder / "p.json", {"code": 1.0}, {"code": _texts(CODE_WORDS, 50, 9)})
    recipe = recipe_from_dict({"name": "m", "sources": [
        {"path": str(folder / "few.jsonl"), "name": "few", "samples": 30, "category": "code"},
        {"path": str(folder / "code.jsonl"), "name": "code", "samples": 30, "category": "code"},
        {"path": str(folder / "chat.jsonl"), "name": "chat", "samples": 20, "category": "chat"}]})
    manifest = build_mix(recipe, folder / "mix", match=profile)
    by_name = {s["name"]: s for s in manifest["sources"]}
    assert by_name["few"]["kept"] == 10 and by_name["code"]["kept"] == 70  # 80 rows of code, 20 handed over
    assert by_name["chat"]["kept"] == 0 and manifest["match"]["not_in_traffic"] == ["chat"]
    assert manifest["rows"] == 80 and manifest["total"]["shortfall"] == 0


def test_a_profile_sharing_no_category_with_the_recipe_is_refused_listing_both(folder: Path, capsys) -> None:
    profile = write_profile(folder / "p.json", {"agentic": 0.5, "reasoning": 0.5}, {})
    recipe = folder / "r.yaml"
    recipe.write_text("name: m\nsources:\n  - path: chat.jsonl\n    samples: 5\n    category: chat\n"
                      "  - path: code.jsonl\n    samples: 5\n    category: general\n")
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(folder / "mix"), "--match", str(profile),
                 "--catalog", str(folder / "c.duckdb")]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "share no category" in err and "agentic, reasoning" in err and "chat, general" in err
    assert not (folder / "mix").exists()
    with pytest.raises(ConfigFileError, match="no such profile"):
        build_mix(recipe_from_dict({"name": "m", "sources": [{"path": str(folder / "chat.jsonl"), "samples": 1}]}),
                  folder / "mix", match=folder / "missing.json")


def test_the_plan_gives_every_shared_category_its_target_even_from_sources_of_zero_recipe_rows(tmp_path: Path) -> None:
    from curator.mix.match import plan
    from curator.traffic.schema import load_profile

    profile = load_profile(write_profile(tmp_path / "p.json", {"code": 0.5, "chat": 0.5}, {}))
    matched = plan(profile, [(0, "code", 0), (1, "chat", 7), (2, "chat", 3), (3, "general", 5)], 15, "uniform")
    assert matched.targets == {"code": 8, "chat": 7, "general": 0}
    assert matched.quotas == {0: {"code": 8}, 1: {"chat": 5}, 2: {"chat": 2}, 3: {"general": 0}}
    assert matched.not_in_traffic == ["general"] and matched.not_in_recipe == {}


@pytest.mark.parametrize("edit", ["buckets", "nan", "negative"])
def test_a_profiles_bucket_count_is_bounded_and_its_counts_finite(folder: Path, edit: str, capsys) -> None:
    """`features.buckets: 1e12` once raised "unexpected MemoryError" (issue 38 item 9); NaN counts were
    accepted and changed which rows --match selects (item 10)."""
    import json as _json

    profile = write_profile(folder / "p.json", {"code": 0.5, "chat": 0.5},
                            {"code": _texts(CODE_WORDS, 20, 1), "chat": _texts(CODE_WORDS, 20, 2)})
    data = _json.loads(profile.read_text())
    per = data["features"]["per_category"]
    if edit == "buckets":
        data["features"]["buckets"] = 1e12
    else:
        first = next(iter(per.values()))
        first["counts"][0] = float("nan") if edit == "nan" else -3.0
    profile.write_text(_json.dumps(data))
    recipe = folder / "r.yaml"
    recipe.write_text("name: m\nsources:\n  - path: chat.jsonl\n    samples: 5\n    category: chat\n"
                      "  - path: code.jsonl\n    samples: 5\n    category: code\n")
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(folder / "mix"), "--match", str(profile),
                 "--catalog", str(folder / "c.duckdb")]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "not a valid traffic profile" in err and "unexpected" not in err
    assert ("buckets" in err) if edit == "buckets" else ("finite" in err)


def test_a_category_is_matched_through_the_traffic_category_it_serves(folder: Path) -> None:
    shares = {"code": 0.6, "chat": 0.4}
    profile = write_profile(folder / "p.json", shares, {"code": _texts(CODE_WORDS, 50, 9), "chat": _texts(CHAT_WORDS, 50, 8)})
    recipe = recipe_from_dict({"name": "m", "seed": 3, "sources": [
        {"path": str(folder / "chat.jsonl"), "name": "chat", "samples": 70, "category": "chat"},
        {"path": str(folder / "code.jsonl"), "name": "coding", "samples": 30, "category": "coding", "traffic": "code"}]})
    manifest = build_mix(recipe, folder / "mix", match=profile)
    # coding gets code's 60% of the 100 rows; the rows keep their category, the match counts them as code
    assert _kept_by_category(manifest) == {"coding": 60, "chat": 40}
    match = manifest["match"]
    assert set(match["categories"]) == {"code", "chat"} and match["categories"]["code"]["kept"] == 60
    assert match["not_in_recipe"] == {} and match["not_in_traffic"] == []
    assert manifest["serves"] == {"chat": "chat", "coding": "code"}


def test_a_short_source_gives_its_remainder_to_the_categories_serving_its_traffic_category(folder: Path) -> None:
    _jsonl(folder / "few.jsonl", _texts(CODE_WORDS, 10, 7))
    profile = write_profile(folder / "p.json", {"code": 0.8, "chat": 0.2}, {"code": _texts(CODE_WORDS, 50, 9)})
    recipe = recipe_from_dict({"name": "m", "sources": [
        {"path": str(folder / "few.jsonl"), "name": "coding", "samples": 40, "category": "coding", "traffic": "code"},
        {"path": str(folder / "code.jsonl"), "name": "debugging", "samples": 40, "category": "debugging", "traffic": "code"},
        {"path": str(folder / "chat.jsonl"), "name": "chat", "samples": 20, "category": "chat"}]})
    manifest = build_mix(recipe, folder / "mix", match=profile)
    # code's 80 rows: coding has 10 of its 40, debugging takes the other 30 on top of its own 40
    assert _kept_by_category(manifest) == {"coding": 10, "debugging": 70, "chat": 20}
    assert manifest["match"]["categories"]["code"]["kept"] == 80 and manifest["total"]["shortfall"] == 0


def test_the_plan_pools_the_categories_serving_one_traffic_category(tmp_path: Path) -> None:
    from curator.mix.match import plan
    from curator.traffic.schema import load_profile

    profile = load_profile(write_profile(tmp_path / "p.json", {"code": 0.5, "chat": 0.5}, {}))
    serves = {"coding": "code", "debugging": "code", "chat": "chat", "general": None}
    matched = plan(profile, [(0, "coding", 6), (1, "debugging", 2), (2, "chat", 1), (3, "general", 5)], 20, "uniform",
                   serves)
    assert matched.targets == {"code": 10, "chat": 10, "general": 0}
    assert matched.quotas == {0: {"coding": 8}, 1: {"debugging": 2}, 2: {"chat": 10}, 3: {"general": 0}}
    assert matched.not_in_traffic == ["general"] and matched.not_in_recipe == {}
    # without the map the names are compared as they are: coding and debugging are no traffic category
    assert plan(profile, [(0, "coding", 6), (2, "chat", 1)], 20, "uniform").not_in_traffic == ["coding"]
