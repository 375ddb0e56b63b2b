"""The counts of a build say what they cover: malformed, filtered, decontaminated and duplicates are over
the rows examined to fill the quota (issue 46 item 5: one file gave "malformed 1" at one quota and
"malformed 0" at another, with nothing saying why)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curator.cli import main
from curator.mix import read_manifest


def _source(folder: Path) -> Path:
    rows = [json.dumps({"conversations": [{"from": "human", "value": f"question {i} about sockets, locks and {i * 7} queues"},
                                          {"from": "gpt", "value": "ok"}]}) for i in range(60)]
    rows.insert(30, "{not json")
    (folder / "chat.jsonl").write_text("\n".join(rows) + "\n")
    return folder / "chat.jsonl"


def _build(folder: Path, samples: int, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str, str]:
    recipe = folder / "recipe.yaml"
    recipe.write_text(f"name: counts\nsources:\n  - path: chat.jsonl\n    name: chat\n    samples: {samples}\n")
    out = folder / f"mix-{samples}"
    capsys.readouterr()
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(out), "--catalog", str(folder / "c.duckdb")]) == 0
    printed = capsys.readouterr()
    return read_manifest(out)["sources"][0], " ".join(printed.out.split()), " ".join(printed.err.split())


def test_counts_over_a_sample_say_they_cover_the_rows_examined(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _source(tmp_path)
    whole, out, err = _build(tmp_path, 61, capsys)  # a quota past the source: every row is examined
    assert (whole["read"], whole["examined"], whole["malformed"], whole["unsampled"]) == (61, 61, 1, 0)
    assert "count the rows examined" not in out and "malformed in chat: broken JSON line" in err
    part, out, err = _build(tmp_path, 10, capsys)
    assert part["read"] == 61 and part["kept"] == 10
    assert part["examined"] == part["malformed"] + part["filtered"] + part["duplicates"] + part["kept"]
    assert part["examined"] + part["unsampled"] == part["read"] and part["examined"] < 61
    # the table's column and a plain line say what the counts are over
    assert "examined" in out and f"chat {part['examined']:,} of 61" in out
    assert "malformed, filtered, decontaminated and duplicates count the rows examined to fill the quotas" in out


def test_a_surveyed_source_counts_what_it_cannot_use_over_every_row(tmp_path: Path) -> None:
    from curator.mix import build_mix, recipe_from_dict

    # a request log is surveyed whole (its categories, its held-out split): its malformed rows are known
    # whatever the quota, so they are counted over the whole log
    rows = [json.dumps({"messages": [{"role": "user", "content": f"explain how {i} sockets and {i * 3} locks interact"}]})
            for i in range(60)]
    for at in (5, 25, 45):
        rows.insert(at, "{not json")
    rows.insert(50, json.dumps({"messages": []}))
    (tmp_path / "traffic.jsonl").write_text("\n".join(rows) + "\n")
    seen = []
    for samples in (4, 40, 100):
        recipe = recipe_from_dict({"name": "t", "sources": [{"path": str(tmp_path / "traffic.jsonl"), "name": "traffic",
                                                              "format": "traffic", "samples": samples}]})
        source = build_mix(recipe, tmp_path / f"mix-{samples}")["sources"][0]
        assert source["read"] == source["examined"] + source["unsampled"] == 64
        seen.append((source["malformed"], sum(source["malformed_reasons"].values())))
    assert seen == [(4, 4)] * 3
