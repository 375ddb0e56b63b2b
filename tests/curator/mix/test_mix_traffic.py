"""The traffic as a source (rows classified, a held-out split written beside the mix and never trained on)
and decontamination (benchmark prompts kept out of the mix, exactly and nearly, counted per source)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from curator.cli import main
from curator.mix import build_mix, load_recipe, open_mix, recipe_from_dict
from curator.mix.prompts import mix_prompts
from curator.mix.survey import conversation_hash
from curator.traffic.synthetic import write_jsonl

WORDS = ("parse file buffer thread lock queue socket retry cache index schema migrate token vector matrix kernel shard "
         "stream batch commit branch merge deploy config route handler error value").split()
SHARES = {"agentic": 0.3, "code": 0.3, "reasoning": 0.2, "chat": 0.2}


def _text(rng: random.Random, n: int = 60) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _opening(messages: list[dict]) -> int:
    from curator.rows.formats.messages import messages as normalise

    return conversation_hash(0, normalise({"messages": messages}))


def _glob_ids(mix: Path) -> list[str]:
    return duckdb.sql(f"SELECT id FROM '{mix}/*.parquet'").fetchnumpy()["id"].tolist()


@pytest.fixture
def traffic(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "traffic.jsonl", 400, SHARES, seed=3)
    return tmp_path / "traffic.jsonl"


def test_held_out_traffic_is_written_beside_the_mix_and_never_in_it(tmp_path: Path, traffic: Path) -> None:
    records = [json.loads(line) for line in traffic.read_text().splitlines()]
    # Another source that repeats a few traffic requests word for word: the held-out ones must not get in that way.
    copies = [{"messages": (r.get("body") or r)["messages"]} for r in records[:80]]
    (tmp_path / "copies.jsonl").write_text("".join(json.dumps(c) + "\n" for c in copies))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: from-traffic\nsources:\n"
                      "  - path: traffic.jsonl\n    name: traffic\n    format: traffic\n    samples: 150\n    heldout: 0.25\n"
                      "  - path: copies.jsonl\n    name: copies\n    samples: 80\n    category: chat\n"
                      "dedup: {exact: true, near: false}\n")
    mix = tmp_path / "mix"
    manifest = build_mix(load_recipe(recipe), mix)
    held = mix / ".heldout"
    held_prompts, malformed = mix_prompts(held)  # what `curator eval --prompts MIX/.heldout` reads
    assert malformed == 0 and len(held_prompts) == manifest["heldout"]["rows"] > 40
    assert {p.category for p in held_prompts} <= set(SHARES) and len({p.category for p in held_prompts}) >= 3
    held_openings = {_opening(p.messages) for p in held_prompts}
    rows = [r for r in open_mix(mix).rows()]
    assert rows and not any(_opening(r.messages) in held_openings for r in rows)  # by conversation
    assert manifest["sources"][1]["decontaminated"] > 0  # the copies of held-out requests were dropped
    traffic_rows = [r for r in rows if r.source == "traffic"]
    assert {r.category for r in traffic_rows} == set(SHARES) and len(traffic_rows) == manifest["sources"][0]["kept"] > 100
    # The documented read-backs of the mix never read the held-out split as part of it.
    assert sorted(_glob_ids(mix)) == sorted(r.id for r in rows)
    assert len(pd.read_parquet(mix)) == manifest["rows"]
    import datasets

    assert len(datasets.load_dataset("parquet", data_dir=str(mix), split="train")) == manifest["rows"]


def test_heldout_as_a_count_of_conversations_and_seeded(tmp_path: Path, traffic: Path) -> None:
    def held(seed: int) -> set[str]:
        recipe = recipe_from_dict({"name": "t", "seed": seed, "sources": [
            {"path": str(traffic), "format": "traffic", "samples": 50, "heldout": 12}]})
        out = tmp_path / f"mix{seed}"
        manifest = build_mix(recipe, out)
        assert manifest["heldout"]["conversations"] == 12
        return {p.id for p in mix_prompts(out / ".heldout")[0]}

    assert held(0) == held(0) and held(0) != held(1)


def test_planted_exact_and_near_benchmark_copies_are_removed_and_counted(tmp_path: Path, capsys) -> None:
    rng = random.Random(5)
    bench = [_text(rng, 120) for _ in range(30)]
    (tmp_path / "evalset.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "42"}) + "\n" for p in bench))
    near = bench[1].split()
    near[60] = "CHANGED"  # one word of 120: 5-gram Jaccard ~0.92
    rows = [{"instruction": _text(rng), "response": "x"} for _ in range(40)]
    rows[5] = {"instruction": bench[0].upper(), "response": "x"}  # exact (after normalising case)
    rows[17] = {"instruction": " ".join(near), "response": "x"}  # near
    (tmp_path / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    chat = [{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"},
                               {"from": "human", "value": bench[2]}, {"from": "gpt", "value": "ok"}]},  # a later turn
            {"conversations": [{"from": "human", "value": "plain question"}]}]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: clean\nsources:\n  - path: code.jsonl\n    name: code\n    samples: 40\n"
                      "  - path: chat.jsonl\n    name: chat\n    samples: 2\n"
                      "decontaminate:\n  - {path: evalset.jsonl, field: prompt}\n")
    capsys.readouterr()
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"), "--catalog", str(tmp_path / "c.duckdb")]) == 0
    shown = capsys.readouterr().out
    assert "decontaminated" in shown and "evalset.jsonl" in shown  # the table shows the counts and the set
    manifest = open_mix(tmp_path / "mix").manifest
    code, chat_src = manifest["sources"]
    assert (code["decontaminated"], code["decontaminated_exact"], code["decontaminated_near"]) == (2, 1, 1)
    assert chat_src["decontaminated"] == 1 and code["kept"] == 38 and chat_src["kept"] == 1
    assert manifest["decontaminate"]["sets"] == [{"name": "evalset.jsonl", "prompts": 30, "malformed": 0, "mix_rows_dropped": 3}]
    texts = " ".join(m["content"] for r in open_mix(tmp_path / "mix").rows() for m in r.messages).lower()
    assert bench[0].lower() not in texts and " ".join(near).lower() not in texts and bench[2].lower() not in texts


def test_a_traffic_source_of_only_invalid_rows_is_named_with_its_reason(tmp_path: Path, capsys) -> None:
    """Such a source was once accepted silently beside others ("read 60, malformed 0") and, alone, failed
    with "tr: 60 read" and no reason (issue 38 item 10)."""
    import json as _json

    from curator.cli import main

    with open(tmp_path / "tr.jsonl", "w") as f:
        for i in range(60):
            f.write(_json.dumps({"messages": [{"role": "assistant", "content": f"hi {i}"}]}) + "\n")
    with open(tmp_path / "ok.jsonl", "w") as f:
        for i in range(20):
            f.write(_json.dumps({"messages": [{"role": "user", "content": f"question {i} about sorting"}]}) + "\n")
    traffic = "  - path: tr.jsonl\n    name: tr\n    format: traffic\n    samples: 10\n    heldout: 0.1\n"
    for extra in ("", "  - path: ok.jsonl\n    samples: 5\n"):
        (tmp_path / "r.yaml").write_text(f"name: t\nsources:\n{traffic}{extra}")
        capsys.readouterr()
        assert main(["build-mix", "--recipe", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "mix"),
                     "--catalog", str(tmp_path / "c.duckdb")]) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert "every row of a source is malformed" in err and "60 malformed (no user turn: 60)" in err, err
        assert not (tmp_path / "mix").exists()


def test_a_held_out_traffic_source_that_keeps_no_row_is_warned_of(tmp_path: Path, traffic: Path, capsys) -> None:
    """Every row filtered (empty user turns) beside a sound source: the build once exited 0 with no
    .heldout and no word of it (sweep item 12). Content, not a broken file: a warning, not the
    "every row of a source is malformed" refusal."""
    with open(tmp_path / "tr.jsonl", "w") as f:
        for i in range(60):
            f.write(json.dumps({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": f"hi {i}"}]}) + "\n")
    with open(tmp_path / "ok.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i} about sorting"}]}) + "\n")
    (tmp_path / "r.yaml").write_text("name: t\nsources:\n  - path: tr.jsonl\n    name: tr\n    format: traffic\n"
                                     "    samples: 10\n    heldout: 0.1\n  - path: ok.jsonl\n    samples: 5\n")
    args = ["build-mix", "--recipe", str(tmp_path / "r.yaml"), "--catalog", str(tmp_path / "c.duckdb")]
    assert main([*args, "--out", str(tmp_path / "mix")]) == 0
    out = capsys.readouterr()
    said = " ".join((out.out + out.err).split())
    assert "warning: source 'tr' asked for heldout: 0.1" in said and "60 filtered (empty_prompt: 60)" in said, said
    assert not (tmp_path / "mix" / ".heldout").exists()
    # a traffic source that holds rows out: no such warning
    (tmp_path / "r2.yaml").write_text(f"name: t2\nsources:\n  - path: {traffic}\n    name: traffic\n"
                                      "    format: traffic\n    samples: 50\n    heldout: 0.25\n")
    assert main(["build-mix", "--recipe", str(tmp_path / "r2.yaml"), "--catalog", str(tmp_path / "c.duckdb"),
                 "--out", str(tmp_path / "mix2")]) == 0
    out = capsys.readouterr()
    assert "asked for heldout" not in out.out + out.err and (tmp_path / "mix2" / ".heldout").is_dir()


def test_the_manifests_record_the_category_each_serves(tmp_path: Path, traffic: Path) -> None:
    (tmp_path / "coding.jsonl").write_text("".join(json.dumps({"instruction": f"write function {i} " + _text(random.Random(i)),
                                                               "response": "ok"}) + "\n" for i in range(30)))
    recipe = recipe_from_dict({"name": "m", "sources": [
        {"path": str(traffic), "name": "traffic", "format": "traffic", "samples": 60, "heldout": 0.2},
        {"path": str(tmp_path / "coding.jsonl"), "name": "coding", "samples": 10, "category": "coding", "traffic": "code"},
        {"path": str(tmp_path / "coding.jsonl"), "name": "misc", "samples": 5, "category": "misc"}]})
    manifest = build_mix(recipe, tmp_path / "mix")
    expected = {"agentic": "agentic", "code": "code", "reasoning": "reasoning", "chat": "chat", "coding": "code", "misc": None}
    assert manifest["serves"] == expected
    # the held-out split, read as `curator eval --prompts MIX/.heldout`, records the same map
    assert open_mix(tmp_path / "mix" / ".heldout").manifest["serves"] == expected
