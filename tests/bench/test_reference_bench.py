"""The GPU reference benchmark's own logic, at toy sizes on the CPU, so that it does not rot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reference.run import main
from bench.reference.target import split_sources


def test_source_split_is_disjoint_and_stable() -> None:
    files = [(f"/lib/pkg/mod{i}.py", f"x = {i}\n") for i in range(400)]
    a, b = split_sources(files), split_sources(list(reversed(files)))
    assert sorted(a.heldout) == sorted(b.heldout) and sorted(a.pool) == sorted(b.pool)
    assert not set(a.heldout) & set(a.pool) and not set(a.pool) & set(a.train)
    assert len(a.heldout) + len(a.pool) + len(a.train) == 400


@pytest.mark.slow
def test_reference_pipeline_runs_at_toy_size(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    argv = ["--tiny", "--workdir", str(tmp_path / "w"), "--out", str(out), "--device", "cpu", "--fp8", "--target-steps", "6"]
    assert main(argv) == 0
    results = json.loads(out.read_text())
    assert "partial" not in results  # the file written after each stage is replaced by the whole result
    assert results["target"]["train_steps"] == 6 and len(results["target"]["weights_sha256"]) == 16
    assert [(row["pool"], row["dtype"]) for row in results["curve"]] == [(16, "bf16"), (32, "bf16"), (32, "fp8")]
    for row in results["curve"]:
        assert row["measured_accept_length"] >= 1.0 and row["offline_accept_length"] >= 1.0
        assert row["simulated_same_prompts"] >= 1.0 and row["simulated_s_per_1k_tokens"] > 0
        assert row["eval_prompts"] == 2
    assert results["generate"]["pool"]["samples"] == 32 and results["hidden_states"]["pool-bf16"]["tokens"] > 0
