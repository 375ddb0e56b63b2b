"""The exported draft served by a real vLLM (CPU build) with method eagle3, in both export layouts.

The engine's own acceptance (its Prometheus counters on /metrics: mean acceptance length and the
per-position rates) on the held-out prompts, greedy, equals what `curator eval` measures on the same
prompt ids with the same draft length and output budget, within 2%. `curator bench-serve --engine
vllm` against the spec server and a baseline server reports the engine's acceptance and tokens/s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serving_fixtures import demo, logs, speculators_export, target_server, vllm_env  # noqa: F401  (fixtures)
from vllm_process import VllmServer, start_or_fail

STEPS = 3
MAX_NEW_TOKENS = 32


def spec_args(draft: Path, steps: int = STEPS, method: str = "eagle3") -> list[str]:
    return ["--speculative-config", json.dumps({"method": method, "model": str(draft), "num_speculative_tokens": steps})]


def heldout_prompt_ids(demo: Path) -> list[tuple[str, list[int]]]:  # noqa: F811
    """The held-out traffic prompts `curator eval` decodes in the demo, as the ids it renders."""
    from curator.mix.prompts import mix_prompts
    from training.evaluate import load_target, render_prompt

    prompts, _ = mix_prompts(demo / "mix" / ".heldout")
    _, tokenizer = load_target(demo / "target")
    return [(p.id, render_prompt(tokenizer, p.messages)) for p in prompts]


def toolkit_acceptance(demo: Path, draft: Path) -> dict[str, Any]:  # noqa: F811
    """`curator eval`'s figures for `draft` on the held-out prompts (greedy, STEPS, MAX_NEW_TOKENS)."""
    from curator.commands.evaluate import measure
    from curator.mix.prompts import mix_prompts
    from training.evaluate import load_target
    from training.export import load_draft

    prompts, _ = mix_prompts(demo / "mix" / ".heldout")
    target, tokenizer = load_target(demo / "target")
    drafter = load_draft(draft, demo / "target")
    report = measure(target, tokenizer, drafter, prompts, steps=STEPS, max_new_tokens=MAX_NEW_TOKENS, tie_margin=1e-4)
    data = report.to_json()
    return {"acceptance_length": data["acceptance_length"],
            "per_position": [r["rate"] for r in data["overall"]["per_position"]], "tokens": data["new_tokens"]}


def engine_acceptance(server: VllmServer, prompts: list[tuple[str, list[int]]]) -> dict[str, Any]:
    """The engine's own figures: its /metrics counters across greedy completions of `prompts`, one at a time."""
    from curator.engines.vllm import VllmSpecCounters

    before = VllmSpecCounters.from_metrics(server.metrics())
    tokens = 0
    for _, ids in prompts:
        answer = server.post("/v1/completions", {"model": server.served_name, "prompt": ids, "max_tokens": MAX_NEW_TOKENS,
                                                 "temperature": 0.0, "return_token_ids": True})
        tokens += len(answer["choices"][0]["token_ids"])
    counted = VllmSpecCounters.from_metrics(server.metrics()).minus(before)
    return {"acceptance_length": counted.acceptance_length, "per_position": counted.position_rates(),
            "drafts": counted.drafts, "tokens": tokens}


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_engine_acceptance_equals_curator_eval(layout: str, demo: Path, speculators_export: Path,  # noqa: F811
                                               logs: Path) -> None:  # noqa: F811
    draft = demo / "export" if layout == "sglang" else speculators_export
    prompts = heldout_prompt_ids(demo)
    assert len(prompts) >= 4
    ours = toolkit_acceptance(demo, draft)
    with start_or_fail(VllmServer(demo / "target", logs, spec_args(draft), max_num_seqs=2)) as server:
        engine = engine_acceptance(server, prompts)
    print(f"{layout}: engine {engine}, curator eval {ours}")
    assert engine["tokens"] == ours["tokens"]  # the same greedy outputs, token for token in number
    assert engine["acceptance_length"] == pytest.approx(ours["acceptance_length"], rel=0.02)
    assert len(engine["per_position"]) == STEPS
    for got, want in zip(engine["per_position"], ours["per_position"]):
        assert got == pytest.approx(want, abs=0.02)
