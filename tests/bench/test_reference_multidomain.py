"""The multi-domain reference's own logic (bench/reference_multidomain), at toy sizes on the CPU:
the code, never the figures."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from bench.reference_multidomain.curate import POOL_SOURCES, ablation_profile, pool_sources
from bench.reference_multidomain.domains import CATEGORY, arithmetic_problem, synthetic, tool_trace
from bench.reference_multidomain.run import findings, main, weighted


def test_arithmetic_problems_are_worked_correctly() -> None:
    rng = random.Random(5)
    for _ in range(200):
        text = arithmetic_problem(rng)
        a, b, prod = map(int, re.search(r"Step 1: (\d+) \* (\d+) = (\d+)", text).groups())
        x, sign, c, total = re.search(r"Step 2: (\d+) ([+-]) (\d+) = (-?\d+)", text).groups()
        assert a * b == prod == int(x) and int(total) == (prod + int(c) if sign == "+" else prod - int(c)) >= 0
        assert text.split("Answer: ")[1].strip() == total


def test_tool_traces_are_json_lines_with_matching_call_ids() -> None:
    lines = [json.loads(line) for line in tool_trace(random.Random(1)).splitlines()]
    calls = [m["tool_calls"][0]["id"] for m in lines if "tool_calls" in m]
    results = [m["tool_call_id"] for m in lines if m["role"] == "tool"]
    assert calls == results and lines[0]["role"] == "user" and lines[-1]["role"] == "assistant"


def test_synthetic_documents_are_deterministic_per_seed() -> None:
    assert synthetic("tools", 3, seed=0) == synthetic("tools", 3, seed=0)
    assert synthetic("arithmetic", 2, seed=0) != synthetic("arithmetic", 2, seed=1)


def test_pool_sources_interleave_domains_and_name_each_row_as_build_mix_will(tmp_path: Path) -> None:
    rows = {d: [{"id": f"{d}-{i}", "messages": [{"role": "user", "content": f"{d} {i}"}]} for i in range(n)]
            for d, n in zip(CATEGORY, (5, 2, 3, 1, 1, 1))}
    files, domain_of = pool_sources(rows, tmp_path)
    assert set(files) == set(POOL_SOURCES) == {"code", "chat", "agentic", "reasoning"}
    code = [json.loads(line)["messages"][0]["content"] for line in files["code"].read_text().splitlines()]
    assert [t.split()[0] for t in code[:6]] == ["python", "c", "config", "python", "c", "config"]
    assert len(code) == 10 and all(domain_of[f"code:{i}"] == t.split()[0] for i, t in enumerate(code))


def test_ablation_profiles_keep_shares_or_features_as_each_variant_says(tmp_path: Path) -> None:
    real = tmp_path / "profile.json"
    real.write_text(json.dumps({"kind": "curator-traffic-profile", "version": 1, "categories": {
        "code": {"share": 0.6, "rows": 6}, "agentic": {"share": 0.2, "rows": 2}, "reasoning": {"share": 0.1, "rows": 1},
        "chat": {"share": 0.1, "rows": 1}}, "features": {"method": "m", "buckets": 4, "per_category": {}}}))
    files = {c: tmp_path / f"{c}.jsonl" for c in POOL_SOURCES}
    assert ablation_profile(real, "generic", files, tmp_path / "x.json") is None
    assert ablation_profile(real, "both", files, tmp_path / "x.json") == real
    quotas = json.loads(ablation_profile(real, "quotas", files, tmp_path / "q.json").read_text())
    assert quotas["features"] is None and quotas["categories"]["code"]["share"] == 0.6
    sel = json.loads(ablation_profile(real, "selection", files, tmp_path / "s.json").read_text())
    assert sel["features"] is not None and sel["categories"]["code"]["share"] == pytest.approx(0.5)
    assert sum(c["share"] for c in sel["categories"].values()) == pytest.approx(1.0)


def test_traffic_weighting_and_the_data_efficiency_ratio() -> None:
    assert weighted({"code": 2.0, "chat": 1.0}, {"code": 0.75, "chat": 0.25}) == pytest.approx(1.75)
    # a category the profile weighs but nobody measured is left out, the rest renormalised
    assert weighted({"code": 2.0}, {"code": 0.5, "agentic": 0.5}) == pytest.approx(2.0)
    rows = {"generic-2": {"measured_weighted": 2.0}, "generic-8": {"measured_weighted": 2.2},
            "matched-2": {"measured_weighted": 2.3}}
    out = findings(rows, 2, 8)
    # the generic curve gains 0.2 per 4x: 2.3 needs 4 ** 1.5 = 8x the small size
    assert out["data_efficiency"]["ratio"] == pytest.approx(8.0, rel=1e-3)
    assert out["matched_small_vs_generic_large"] == pytest.approx(0.1)


@pytest.mark.slow
def test_reference_multidomain_runs_at_toy_size(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    assert main(["--tiny", "--workdir", str(tmp_path / "w"), "--out", str(out), "--device", "cpu",
                 "--target-steps", "3"]) == 0
    results = json.loads(out.read_text())
    assert "partial" not in results
    assert set(results["profile"]["shares"]) <= {"agentic", "code", "reasoning", "chat"}
    assert abs(sum(results["profile"]["shares"].values()) - 1) < 1e-6
    drafts = results["drafts"]
    assert list(drafts)[:4] == ["matched-24", "generic-24", "generic-48", "matched-48"]
    assert {"quotas-only-24", "selection-only-24"} <= set(drafts) and len(drafts) == 9
    for row in drafts.values():
        assert row["train_steps"] == 3 and row["measured"] and row["simulated"]
        assert row["measured_weighted"] >= 1.0
    mixes = results["mixes"]
    assert mixes["generic-48"]["match"] is None and mixes["matched-48"]["match"]["method"].startswith("dsir")
    assert mixes["quotas-only-24"]["match"]["method"].startswith("uniform")
    assert results["forecast"]["measured"]["from_drafts"][0] == "matched-24"
    assert set(results["findings"]) == {"measured", "simulated"}
    assert main(["--findings-from", str(out)]) == 0
    # the forecast's cost inputs, read from this run's own generation output and target
    from curator import forecast as fc
    from training.storage.format import bytes_per_token

    gen = fc.generation_cost(tmp_path / "w" / "gen-union")
    assert set(gen.tokens_per_sample) <= {"agentic", "code", "reasoning", "chat"} and gen.output_tokens_per_s > 0
    assert all(gen.tokens_per_sample[c] > gen.answer_tokens_per_sample[c] > 0 for c in gen.tokens_per_sample)
    assert fc.store_bytes_per_token(tmp_path / "w" / "target") == bytes_per_token(64, 3, "bf16", True)
