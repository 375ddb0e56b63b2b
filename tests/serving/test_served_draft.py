"""The exported draft served by a real vLLM (CPU build) with method eagle3, in both export layouts.

The engine's own acceptance (its Prometheus counters on /metrics: mean acceptance length and the
per-position rates) on the held-out prompts, greedy, equals what `curator eval` measures on the same
prompt ids with the same draft length and output budget, within 2%. `curator bench-serve --engine
vllm` against the spec server and a baseline server reports the engine's acceptance and tokens/s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving_fixtures import MAX_NEW_TOKENS, STEPS, engine_acceptance, heldout_prompt_ids, spec_args, toolkit_acceptance
from vllm_process import VllmServer, start_or_fail


def test_sglang_layout_engine_acceptance_equals_curator_eval(demo: Path, spec_server: VllmServer) -> None:
    check_acceptance("sglang", demo / "export", spec_server, demo)


def test_speculators_layout_engine_acceptance_equals_curator_eval(demo: Path, speculators_export: Path,
                                                                  logs: Path) -> None:
    with start_or_fail(VllmServer(demo / "target", logs, spec_args(speculators_export), max_num_seqs=2)) as server:
        check_acceptance("speculators", speculators_export, server, demo)


def check_acceptance(layout: str, draft: Path, server: VllmServer, demo: Path) -> None:
    prompts = heldout_prompt_ids(demo)
    assert len(prompts) >= 4
    ours = toolkit_acceptance(demo, draft)
    engine = engine_acceptance(server, prompts)
    print(f"{layout}: engine {engine}, curator eval {ours}")
    assert engine["tokens"] == ours["tokens"]  # the same greedy outputs, token for token in number
    assert engine["acceptance_length"] == pytest.approx(ours["acceptance_length"], rel=0.02)
    assert len(engine["per_position"]) == STEPS
    for got, want in zip(engine["per_position"], ours["per_position"]):
        assert got == pytest.approx(want, abs=0.02)


def test_bench_serve_reports_the_engines_acceptance_and_tokens_per_s(demo: Path, spec_server: VllmServer,
                                                                      target_server: VllmServer,
                                                                      tmp_path: Path) -> None:
    """`curator bench-serve --engine vllm`: the engine's own acceptance (its /metrics, read around the run
    here too) and real tokens/s of the spec server and the baseline server."""
    from curator.cli import main
    from curator.engines import vllm

    draft = demo / "export"
    out = tmp_path / "bench.json"
    before = vllm.spec_counters(spec_server.metrics())
    assert main(["bench-serve", "--engine", "vllm", "--endpoint", spec_server.url, "--baseline", target_server.url,
                 "--prompts", str(demo / "mix"), "--draft", str(draft), "--max-tokens", str(MAX_NEW_TOKENS),
                 "--concurrency", "1", "--json", str(out)]) == 0
    counted = vllm.spec_counters(spec_server.metrics()).minus(before)
    report = json.loads(out.read_text())
    figures = report["concurrency"]["1"]
    print(f"bench-serve: {figures}; the engine's counters over the run: {counted.acceptance_length}")
    assert counted.drafts > 0
    # per-category groups, each its own /metrics difference, combined verify-weighted by bench-serve
    assert figures["acceptance_length"] == pytest.approx(counted.acceptance_length, rel=0.03)
    assert figures["draft_tokens_per_s"] > 0 and figures["baseline_tokens_per_s"] > 0
