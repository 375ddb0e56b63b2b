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

from serving_fixtures import (  # noqa: F401  (fixtures)
    MAX_NEW_TOKENS, STEPS, demo, engine_acceptance, heldout_prompt_ids, logs, spec_args, speculators_export,
    target_server, toolkit_acceptance, vllm_env)
from vllm_process import VllmServer, start_or_fail

@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_engine_acceptance_equals_curator_eval(layout: str, demo: Path, speculators_export: Path,  # noqa: F811
                                               logs: Path, target_server: VllmServer, tmp_path: Path) -> None:  # noqa: F811
    draft = demo / "export" if layout == "sglang" else speculators_export
    prompts = heldout_prompt_ids(demo)
    assert len(prompts) >= 4
    ours = toolkit_acceptance(demo, draft)
    with start_or_fail(VllmServer(demo / "target", logs, spec_args(draft), max_num_seqs=2)) as server:
        engine = engine_acceptance(server, prompts)
        if layout == "sglang":
            bench_serve(server, target_server, demo, draft, tmp_path)
    print(f"{layout}: engine {engine}, curator eval {ours}")
    assert engine["tokens"] == ours["tokens"]  # the same greedy outputs, token for token in number
    assert engine["acceptance_length"] == pytest.approx(ours["acceptance_length"], rel=0.02)
    assert len(engine["per_position"]) == STEPS
    for got, want in zip(engine["per_position"], ours["per_position"]):
        assert got == pytest.approx(want, abs=0.02)


def bench_serve(spec: VllmServer, baseline: VllmServer, demo: Path, draft: Path, tmp: Path) -> None:  # noqa: F811
    """`curator bench-serve --engine vllm`: the engine's own acceptance (its /metrics, read around the run
    here too) and real tokens/s of the spec server and the baseline server."""
    from curator.cli import main
    from curator.engines import vllm

    out = tmp / "bench.json"
    before = vllm.spec_counters(spec.metrics())
    assert main(["bench-serve", "--engine", "vllm", "--endpoint", spec.url, "--baseline", baseline.url,
                 "--prompts", str(demo / "mix"), "--draft", str(draft), "--max-tokens", str(MAX_NEW_TOKENS),
                 "--concurrency", "1", "--json", str(out)]) == 0
    counted = vllm.spec_counters(spec.metrics()).minus(before)
    report = json.loads(out.read_text())
    figures = report["concurrency"]["1"]
    print(f"bench-serve: {figures}; the engine's counters over the run: {counted.acceptance_length}")
    assert counted.drafts > 0
    # per-category groups, each its own /metrics difference, combined verify-weighted by bench-serve
    assert figures["acceptance_length"] == pytest.approx(counted.acceptance_length, rel=0.03)
    assert figures["draft_tokens_per_s"] > 0 and figures["baseline_tokens_per_s"] > 0
