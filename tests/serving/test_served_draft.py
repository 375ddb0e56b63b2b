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

from serving_fixtures import (
    MAX_NEW_TOKENS, STEPS, engine_acceptance, heldout_prompt_ids, ratio_and_se, spec_args, toolkit_acceptance)
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


TEMPERATURE = 0.8
SEEDS = 4  # each held-out prompt sampled this many times on each side
NOISE_Z = 3.0  # how many standard errors of the difference two unbiased samples may differ by
NEAR_GREEDY = 0.01  # the lowest temperature vLLM takes (it raises lower ones to 0.01)


def sampled_counts(server: VllmServer, prompts: list[tuple[str, list[int]]], temperature: float,
                   seeds: int) -> list[list[float]]:
    """Per sequence: the engine's drafts, accepted tokens, and accepted at positions 1..STEPS (its
    /metrics counters around each request, one at a time, each with its own seed)."""
    from curator.engines import vllm

    rows = []
    for seed in range(seeds):
        for i, (_, ids) in enumerate(prompts):
            before = vllm.spec_counters(server.metrics())
            server.post("/v1/completions", {"model": server.served_name, "prompt": ids, "max_tokens": MAX_NEW_TOKENS,
                                            "temperature": temperature, "seed": 1000 * seed + i})
            c = vllm.spec_counters(server.metrics()).minus(before)
            rows.append([c.drafts, c.accepted, *(c.accepted_per_pos.get(k, 0.0) for k in range(STEPS))])
    return rows


def test_sampled_acceptance_equals_curator_eval_within_sampling_noise(demo: Path, spec_server: VllmServer) -> None:
    """At temperature 0.8 the engine verifies by sampling, `curator eval --temperature 0.8` too (the target
    samples; a draft token d is accepted with probability p(d), as both engines do for a draft that
    proposes greedily): the outputs differ, sample by sample, so the acceptance lengths agree only in
    law. Each side decodes every held-out prompt SEEDS times (its own seeds); the sequences are
    independent draws, the drafts within one are not, so the bound is NOISE_Z cluster-robust standard
    errors of the difference of the two ratio estimates (accepted / drafts), per position too.

    First the engine's sampled path is checked where the answer is known without noise: at
    temperature 0.01 the target's distribution is its argmax, so a sampling verifier accepts what the
    greedy one does. vLLM 0.32.0's CPU build does not (docs/engines.md): the test then xfails with
    the figures, and runs the comparison again, to hold, once the engine accepts near-greedy drafts."""
    from curator.evaluation.measure import measure
    from curator.mix.prompts import mix_prompts
    from training.eagle3.load import load_draft
    from training.eval.evaluate import load_target
    from training.eval.sampling import Sampling

    held = heldout_prompt_ids(demo)
    greedy = engine_acceptance(spec_server, held)
    near = sampled_counts(spec_server, held, NEAR_GREEDY, 1)
    near_rate = sum(r[1] for r in near) / sum(r[0] for r in near)
    greedy_rate = greedy["acceptance_length"] - 1
    print(f"engine accepted per draft: greedy {greedy_rate:.4f}, temperature {NEAR_GREEDY} {near_rate:.4f} "
          f"({sum(r[0] for r in near):.0f} drafts)")
    if near_rate < 0.5 * greedy_rate:
        pytest.xfail(f"vLLM's sampled verification accepts {near_rate:.3f} tokens per draft at temperature "
                     f"{NEAR_GREEDY}, where its greedy one accepts {greedy_rate:.3f}: the engine's sampled path "
                     "does not verify as it should, so there is no law to compare curator eval's with")

    prompts, _ = mix_prompts(demo / "mix" / ".heldout")
    target, tokenizer = load_target(demo / "target")
    drafter = load_draft(demo / "export", demo / "target")
    engine = sampled_counts(spec_server, held, TEMPERATURE, SEEDS)
    ours: list[list[float]] = []
    for seed in range(SEEDS):
        for p in prompts:
            stats = measure(target, tokenizer, drafter, [p], steps=STEPS, max_new_tokens=MAX_NEW_TOKENS,
                            tie_margin=1e-4, sampling=Sampling(TEMPERATURE, seed=seed)).overall
            ours.append([stats.forwards, sum(stats.accepted),
                         *(sum(a >= k for a in stats.accepted) for k in range(1, STEPS + 1))])
    for col, what in [(1, "acceptance length - 1"), *((2 + k, f"position {k + 1} rate") for k in range(STEPS))]:
        e, e_se = ratio_and_se([(r[0], r[col]) for r in engine])
        o, o_se = ratio_and_se([(r[0], r[col]) for r in ours])
        bound = NOISE_Z * (e_se**2 + o_se**2) ** 0.5
        print(f"T={TEMPERATURE} {what}: engine {e:.4f} (se {e_se:.4f}, {sum(r[0] for r in engine):.0f} drafts), "
              f"curator eval {o:.4f} (se {o_se:.4f}, {sum(r[0] for r in ours):.0f} drafts), bound {bound:.4f}")
        assert abs(e - o) <= bound, (what, e, o, bound)
