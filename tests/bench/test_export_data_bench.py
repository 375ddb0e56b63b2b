"""bench/export_data_bench.py at toy size: each layout exported and the same bytes copied, both timed."""

from __future__ import annotations

from pathlib import Path

from bench import export_data_bench as bench


def test_the_bench_times_each_export_against_a_copy_of_its_bytes(tmp_path: Path) -> None:
    result = bench.run(records=6, tokens=64, hidden=16, scratch=tmp_path)
    assert set(result["layouts"]) == set(bench.LAYOUTS)
    for layout, r in result["layouts"].items():
        per_row = 64 * 4 * 16 * 2  # aux (3 layers) and one final state, bf16
        assert r["bytes"] >= 6 * per_row, layout
        assert r["export_s"] > 0 and r["copy_s"] > 0 and r["export_over_copy"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # the exports and copies are removed
