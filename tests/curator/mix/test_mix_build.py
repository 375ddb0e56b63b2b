"""build-mix end to end on local sources: dedup across sources, malformed rows, quotas, determinism."""

from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curator.catalog import Catalog
from curator.cli import main
from curator.errors import ConfigError
from curator.mix import build_mix, load_recipe, read_manifest, recipe_from_catalog, recipe_from_dict
from curator.rows.readers import read_json

WORDS = (
    "parse file buffer thread lock queue socket retry cache index schema migrate token vector "
    "matrix kernel shard stream batch commit branch merge deploy config route handler error value"
).split()


def _text(rng: random.Random, n: int = 40) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


PLANTED = _text(random.Random(99), 120)  # a long prompt planted in several sources


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _sharegpt(prompt: str) -> dict:
    return {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": "ok"}]}


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    rng = random.Random(0)
    chat = [_sharegpt(_text(rng)) for _ in range(60)]
    chat[10] = _sharegpt(PLANTED)
    chat += [
        "{not json",  # broken line
        {"id": "no conversations"},  # missing field
        {"conversations": []},  # empty turns
        {"conversations": [{"from": "human", "value": 7}]},  # wrong type
        _sharegpt("   "),  # empty prompt: filtered
        _sharegpt("x" * 5000),  # too long: filtered
    ]
    _jsonl(tmp_path / "chat.jsonl", chat)

    words = PLANTED.split()
    words[60] = "CHANGED"  # one word of 120: Jaccard of 5-grams ~0.92, a near-duplicate
    code = [{"instruction": _text(rng), "response": "def f(): pass"} for _ in range(40)]
    code[3] = {"instruction": " ".join(words), "response": "x"}
    pq.write_table(pa.Table.from_pylist(code), tmp_path / "code.parquet")

    # Exact duplicate of the planted prompt (case and whitespace differ), in a JSON array file.
    glaive = [
        {"system": "SYSTEM: You can call get_time.", "chat": f"USER: {_text(rng)}\n\n\nASSISTANT: <functioncall> {{\"name\": \"get_time\"}} <|endoftext|>\n\n\nFUNCTION RESPONSE: {{\"t\": 1}}\n\n\nASSISTANT: It is one. <|endoftext|>"}
        for _ in range(20)
    ]
    glaive[5]["chat"] = f"USER: {PLANTED.upper()}  \n\n\nASSISTANT: sure <|endoftext|>"
    (tmp_path / "glaive.json").write_text(json.dumps(glaive))
    return tmp_path


def _recipe(folder: Path, seed: int = 0, **overrides) -> Path:
    text = f"""
name: test-mix
seed: {seed}
sources:
  - path: chat.jsonl
    name: chat
    samples: {overrides.get('chat', 100)}
    category: chat
  - path: code.parquet
    name: code
    samples: {overrides.get('code', 40)}
    category: code
  - path: glaive.json
    name: glaive
    samples: 20
    category: agentic
dedup: {{exact: true, near: 0.85}}
filters: {{max_prompt_chars: 4000}}
rows_per_part: {overrides.get('rows_per_part', 1000)}
"""
    path = folder / f"recipe-{seed}.yaml"
    path.write_text(text)
    return path


def _rows(out: Path) -> list[dict]:
    return pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()


def test_planted_duplicates_are_kept_once_from_the_higher_priority_source(sources, tmp_path):
    manifest = build_mix(load_recipe(_recipe(sources)), tmp_path / "out")
    rows = _rows(tmp_path / "out")
    planted_head = " ".join(PLANTED.split()[:20])
    holders = [r["source"] for r in rows if r["messages"][-1]["content"].lower().startswith(planted_head)]
    assert holders == ["chat"]
    pairs = {(d["kept_source"], d["dropped_source"]): d for d in manifest["duplicates"]}
    assert pairs[("chat", "code")]["near"] == 1
    assert pairs[("chat", "glaive")]["exact"] == 1
    by_name = {s["name"]: s for s in manifest["sources"]}
    assert by_name["code"]["duplicates_near"] == 1 and by_name["glaive"]["duplicates_exact"] == 1


def test_malformed_rows_are_counted_with_reasons_and_skipped(sources, tmp_path):
    manifest = build_mix(load_recipe(_recipe(sources)), tmp_path / "out")
    chat = manifest["sources"][0]
    assert chat["read"] == 66
    assert chat["malformed"] == 4
    reasons = " ".join(chat["malformed_reasons"])
    assert "broken JSON line" in reasons and "missing field 'conversations'" in reasons and "empty" in reasons
    assert chat["filtered"] == 2 and chat["filtered_reasons"] == {"empty_prompt": 1, "too_long_chars": 1}
    assert chat["kept"] == 60


def test_every_row_read_is_accounted_for(sources, tmp_path):
    manifest = build_mix(load_recipe(_recipe(sources, chat=25)), tmp_path / "out")
    for s in manifest["sources"]:
        assert s["read"] == s["malformed"] + s["filtered"] + s["duplicates"] + s["kept"] + s["unsampled"]


def test_quota_met_when_enough_rows_and_shortfall_reported_when_not(sources, tmp_path):
    manifest = build_mix(load_recipe(_recipe(sources, chat=25, code=500)), tmp_path / "out")
    chat, code, _ = manifest["sources"]
    assert chat["kept"] == 25 and chat["shortfall"] == 0 and chat["unsampled"] > 0
    # 40 rows; the planted near-duplicate only counts if chat's sample holds its original.
    assert code["kept"] + code["duplicates"] == 40 and code["shortfall"] == 500 - code["kept"]
    assert manifest["rows"] == len(_rows(tmp_path / "out")) == manifest["total"]["kept"]


def test_same_recipe_same_bytes_and_another_seed_another_sample(sources, tmp_path):
    recipe = _recipe(sources, chat=20, rows_per_part=15)
    build_mix(load_recipe(recipe), tmp_path / "a")
    build_mix(load_recipe(recipe), tmp_path / "b")
    every_file = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())  # noqa: E731
    files = every_file(tmp_path / "a")
    assert files == every_file(tmp_path / "b") and len(files) > 2
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    build_mix(load_recipe(_recipe(sources, seed=7, chat=20, rows_per_part=15)), tmp_path / "c")
    ids = lambda d: {r["id"] for r in _rows(tmp_path / d) if r["source"] == "chat"}  # noqa: E731
    assert ids("a") != ids("c") and len(ids("c")) == 20


def test_output_has_the_contract_schema_and_turn_policy(sources, tmp_path):
    build_mix(load_recipe(_recipe(sources)), tmp_path / "out")
    table = pq.read_table(next((tmp_path / "out").glob("part-00000-*.parquet")))
    assert table.schema.names == ["id", "source", "category", "messages", "turns", "keep_responses", "tools", "source_id"]
    assert table.schema.field("messages").type.value_type.names == ["role", "content", "tool_calls", "tool_call_id", "name"]
    rows = table.to_pylist()
    assert len({r["id"] for r in rows}) == len(rows)
    glaive = [r for r in rows if r["source"] == "glaive"]
    assert glaive and all(r["turns"] == "last" and r["messages"][-1]["role"] in ("user", "tool") for r in glaive)
    chat = [r for r in rows if r["source"] == "chat"]
    assert all(r["turns"] == "all" and [m["role"] for m in r["messages"]] == ["user"] for r in chat)
    assert {r["category"] for r in rows} == {"chat", "code", "agentic"}


def test_walk_reads_the_source_again_when_duplicates_exhaust_the_candidates(tmp_path):
    rng = random.Random(3)
    uniques = [_text(rng, 30) for _ in range(15)]
    rows = [_sharegpt(uniques[i % 15] if i < 15 else uniques[0]) for i in range(400)]  # 385 copies of one prompt
    _jsonl(tmp_path / "dups.jsonl", rows)
    recipe = recipe_from_dict({"name": "d", "sources": [{"path": str(tmp_path / "dups.jsonl"), "samples": 12}]})
    src = build_mix(recipe, tmp_path / "out")["sources"][0]
    assert src["kept"] == 12 and src["shortfall"] == 0
    assert src["duplicates"] > 76 - 12  # more than one pass's worth of candidates were duplicates


def test_rebuild_replaces_old_parts(sources, tmp_path):
    build_mix(load_recipe(_recipe(sources, rows_per_part=10)), tmp_path / "out")
    assert len(list((tmp_path / "out").glob("part-*.parquet"))) > 5
    manifest = build_mix(load_recipe(_recipe(sources)), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*.parquet")) == [p["file"] for p in manifest["parts"]]
    assert read_manifest(tmp_path / "out")["rows"] == manifest["rows"]
    assert not list((tmp_path / "out").glob(".*tmp*"))


def test_hub_reader_streams_a_local_dataset_folder_through_datasets(tmp_path):
    ds_dir = tmp_path / "hubish" / "data"
    ds_dir.mkdir(parents=True)
    rng = random.Random(5)
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "p", "prompt_id": str(i), "messages": [{"content": _text(rng), "role": "user"}, {"content": "a", "role": "assistant"}]} for i in range(30)]),
        ds_dir / "train-00000-of-00001.parquet",
    )
    recipe = recipe_from_dict({"name": "h", "sources": [{"dataset": str(tmp_path / "hubish"), "split": "train", "samples": 10}]})
    manifest = build_mix(recipe, tmp_path / "out")
    src = manifest["sources"][0]
    assert src["format"] == "messages" and src["read"] == 30 and src["kept"] == 10


def test_json_array_is_streamed_and_a_broken_tail_is_counted(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"a": i} for i in range(5)])[:-1] + ', {"b": ')
    rows = list(read_json(path))
    assert [r["a"] for r in rows[:5]] == list(range(5)) and "broken JSON" in rows[5].reason


def test_license_allow_list_skips_sources_and_reports_the_shortfall(sources, tmp_path):
    data = {
        "name": "lic",
        "filters": {"licenses": ["apache-2.0", "mit"]},
        "sources": [
            {"path": str(sources / "chat.jsonl"), "samples": 5, "license": "MIT"},
            {"path": str(sources / "code.parquet"), "samples": 5, "license": "cc-by-nc-4.0"},
            {"path": str(sources / "glaive.json"), "samples": 5},
        ],
    }
    manifest = build_mix(recipe_from_dict(data), tmp_path / "out")
    chat, code, glaive = manifest["sources"]
    assert chat["kept"] == 5
    assert "not in the allow-list" in code["skipped"] and code["shortfall"] == 5
    assert "license unknown" in glaive["skipped"]


def test_token_filter_uses_the_target_tokenizer(sources, tmp_path, tiny_target):
    recipe = recipe_from_dict({"name": "t", "sources": [{"path": str(sources / "code.parquet"), "samples": 40}]})
    manifest = build_mix(recipe, tmp_path / "out", tokenizer=tiny_target, max_prompt_tokens=200)
    src = manifest["sources"][0]
    assert src["filtered_reasons"].get("too_long_tokens", 0) >= 1 and src["kept"] + src["filtered"] == 40
    with pytest.raises(ConfigError, match="tokenizer"):
        build_mix(recipe, tmp_path / "out2", max_prompt_tokens=45)


def test_cli_builds_records_in_catalog_and_sql_reads_the_parquet(sources, tmp_path, capsys):
    catalog = tmp_path / "cat.duckdb"
    out = tmp_path / "mix"
    assert main(["build-mix", "--recipe", str(_recipe(sources)), "--out", str(out), "--catalog", str(catalog)]) == 0
    printed = capsys.readouterr()
    assert "mix test-mix" in printed.out and "duplicates by source pair" in printed.out
    assert "malformed in chat" in printed.err
    cols, rows = Catalog.open(catalog).query("SELECT name, rows FROM mixes")
    assert rows == [("test-mix", read_manifest(out)["rows"])]
    counts = duckdb.sql(f"SELECT source, count(*) FROM '{out}/part-*.parquet' GROUP BY 1 ORDER BY 1").fetchall()
    assert dict(counts) == {"chat": 60, "code": 39, "glaive": 19}
    assert main(["sql", f"SELECT count(*) AS n FROM '{out}/*.parquet'", "--catalog", str(catalog)]) == 0


def test_cli_refuses_bad_input_with_one_line(tmp_path, capsys):
    assert main(["build-mix", "--out", str(tmp_path / "o"), "--catalog", str(tmp_path / "c.duckdb")]) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsources:\n  - path: nowhere.jsonl\n    samples: 1\n")
    assert main(["build-mix", "--recipe", str(bad), "--out", str(tmp_path / "o"), "--catalog", str(tmp_path / "c.duckdb")]) == 1
    assert "no such file or folder" in " ".join(capsys.readouterr().err.split())


def test_from_catalog_builds_from_approved_candidates(tmp_path, capsys):
    rng = random.Random(8)
    for name, n in (("chat-ds", 50), ("other-ds", 50), ("rejected-ds", 10)):
        d = tmp_path / name
        d.mkdir()
        _jsonl(d / "train.jsonl", [_sharegpt(_text(rng)) for _ in range(n)])
    catalog = Catalog.open(tmp_path / "cat.duckdb")
    ids = {}
    for name, samples in (("chat-ds", 30), ("other-ds", 10), ("rejected-ds", 5)):
        catalog.upsert_dataset({"dataset_id": str(tmp_path / name), "license": "apache-2.0"})
        ids[name] = catalog.add_candidate("run", "agent", str(tmp_path / name), "chat", 0.9, "good", samples)
    catalog.approve(ids["chat-ds"])
    catalog.approve(ids["other-ds"], samples=20)  # reviewer's override wins over the suggestion
    catalog.reject(ids["rejected-ds"])
    recipe = recipe_from_catalog(catalog.approved_candidates(), target_samples=10)
    assert sorted(s.samples for s in recipe.sources) == [4, 6]
    assert recipe.served_categories() == {"chat": "chat"}  # no briefs: a traffic category's name serves itself
    served = recipe_from_catalog(catalog.approved_candidates(), served={"chat": "chat", "coding": "code"})
    assert all(s.traffic is None for s in served.sources)  # only a category serving another one is written
    out = tmp_path / "mix"
    code = main(["build-mix", "--from-catalog", "--out", str(out), "--catalog", str(tmp_path / "cat.duckdb")])
    assert code == 0
    manifest = read_manifest(out)
    assert {s["name"]: s["kept"] for s in manifest["sources"]} == {str(tmp_path / "chat-ds"): 30, str(tmp_path / "other-ds"): 20}


def test_a_catalog_mix_of_brief_categories_records_what_each_serves(tmp_path, monkeypatch):
    rng = random.Random(9)
    (tmp_path / "coding-ds").mkdir()
    _jsonl(tmp_path / "coding-ds" / "train.jsonl", [_sharegpt(_text(rng)) for _ in range(20)])
    catalog = Catalog.open(tmp_path / "cat.duckdb")
    catalog.upsert_dataset({"dataset_id": str(tmp_path / "coding-ds"), "license": "apache-2.0"})
    catalog.approve(catalog.add_candidate("run", "agent", str(tmp_path / "coding-ds"), "coding", 0.9, "good", 10))
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "coding.md").write_text("---\nid: coding\ntitle: Coding\ncategory: coding\ntraffic: code\n"
                                      "seed_queries: [code]\ngood_find: coding requests\n---\n")
    for briefs, serves in ((agents, {"coding": "code"}), (tmp_path / "none", {"coding": None})):
        monkeypatch.setenv("CURATOR_AGENTS_DIR", str(briefs))
        out = tmp_path / f"mix-{briefs.name}"
        assert main(["build-mix", "--from-catalog", "--out", str(out), "--catalog", str(tmp_path / "cat.duckdb")]) == 0
        manifest = read_manifest(out)
        assert manifest["serves"] == serves
        assert manifest["recipe"]["sources"][0]["traffic"] == serves["coding"]
