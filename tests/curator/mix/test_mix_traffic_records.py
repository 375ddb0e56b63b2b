"""build-mix reads a traffic source's records as `curator profile` does: the `developer` role as system,
multimodal content by its text parts, and completions requests (`{"prompt": ...}`) as one user turn."""

from __future__ import annotations

import json
from pathlib import Path

from curator.mix import build_mix, open_mix, recipe_from_dict
from curator.rows.formats.traffic import traffic
from curator.traffic.read import iter_traffic

RECORDS = [
    {"model": "m", "messages": [{"role": "developer", "content": "Answer briefly."},
                                {"role": "user", "content": "What is the capital of France, and why is it there?"}]},
    {"prompt": "Write a haiku about a lighthouse keeper who counts the waves at night."},
    {"body": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe this picture of a harbour at dawn "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "in two sentences."}]}]}},
]


def test_traffic_normaliser_reads_developer_prompt_and_multimodal_records() -> None:
    convs = [traffic(r) for r in RECORDS]
    assert list(convs[0])[0] == ("system", "Answer briefly.")
    assert list(convs[1]) == [("user", RECORDS[1]["prompt"])]
    assert list(convs[2]) == [("user", "Describe this picture of a harbour at dawn in two sentences.")]


def test_build_mix_and_profile_read_the_same_traffic_records(tmp_path: Path) -> None:
    log = tmp_path / "traffic.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    profiled = [row.messages for row in iter_traffic(log)]
    recipe = recipe_from_dict({"name": "t", "sources": [{"path": str(log), "format": "traffic", "samples": 3}],
                               "dedup": {"exact": True, "near": False}})
    manifest = build_mix(recipe, tmp_path / "mix")
    source = manifest["sources"][0]
    assert source["malformed"] == 0 and source["kept"] == 3
    rows = sorted((r.messages for r in open_mix(tmp_path / "mix").rows()), key=json.dumps)
    assert rows == sorted(profiled, key=json.dumps)
    assert any(m[0] == {"role": "system", "content": "Answer briefly."} for m in rows)
    assert any(m == [{"role": "user", "content": RECORDS[1]["prompt"]}] for m in rows)
