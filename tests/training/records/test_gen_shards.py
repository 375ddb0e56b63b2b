"""The generation output's shard names: one owner for the writer and every reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from curator.generate.shards import ShardWriter, scan_shards
from training.errors import TrainingError
from training.records.chat_tokens import generation_files, iter_generation
from training.records.gen_shards import record_lines, shard_index, shard_name, shard_paths


def test_shards_are_listed_in_index_order_and_nothing_else_is_a_shard(tmp_path: Path) -> None:
    for i in (100000, 2, 99999):
        (tmp_path / shard_name(i)).write_text('{"id": "a", "messages": []}\n')
    for other in ("shard-7.jsonl", "shard-abc.jsonl", ".shard-00003.jsonl.tmp", "notes.jsonl"):
        (tmp_path / other).write_text("{}\n")
    names = [p.name for p in shard_paths(tmp_path)]
    assert names == ["shard-00002.jsonl", "shard-99999.jsonl", "shard-100000.jsonl"]
    assert generation_files(tmp_path) == shard_paths(tmp_path)  # the trainer reads what generate wrote
    assert shard_index("shard-00002.jsonl") == 2 and shard_index("shard-7.jsonl") is None


def test_the_writer_names_its_shards_as_the_readers_find_them(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, 0, max_rows=1)
    for i in range(3):
        writer.add({"id": f"r{i}", "messages": [{"role": "user", "content": "hi"}]})
    assert [p.name for p in shard_paths(tmp_path)] == [shard_name(i) for i in range(3)]
    assert scan_shards(tmp_path).done_ids == {"r0", "r1", "r2"} and scan_shards(tmp_path).next_index == 3
    assert [r["id"] for r in iter_generation(tmp_path)] == ["r0", "r1", "r2"]


def test_a_line_that_is_no_object_is_one_malformed_line(tmp_path: Path) -> None:
    path = tmp_path / shard_name(0)
    path.write_bytes(b'{"id": "a"}\n\nnot json\n[1]\n{"id": "caf\xe9"}\n')
    assert [r is None for r in record_lines(path)] == [False, True, True, True]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainingError, match="no shard-\\*.jsonl files"):
        generation_files(tmp_path / "empty")
