"""What the real-engine tests share besides their fixtures (conftest.py): the settings of the
acceptance runs, and the engine's and `curator eval`'s acceptance on the demo's held-out prompts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_process import VllmServer


# ---------------------------------------------------------------- acceptance, the toolkit's and the engine's

STEPS = 3  # draft tokens per step, the demo's eval setting
MAX_NEW_TOKENS = 32


def spec_args(draft: Path, steps: int = STEPS, method: str = "eagle3") -> list[str]:
    return ["--speculative-config", json.dumps({"method": method, "model": str(draft), "num_speculative_tokens": steps})]


def heldout_prompt_ids(demo: Path) -> list[tuple[str, list[int]]]:
    """The held-out traffic prompts `curator eval` decodes in the demo, as the ids it renders."""
    from curator.mix.prompts import mix_prompts
    from training.eval.evaluate import load_target
    from training.eval.prompts import render_prompt

    prompts, _ = mix_prompts(demo / "mix" / ".heldout")
    _, tokenizer = load_target(demo / "target")
    return [(p.id, render_prompt(tokenizer, p.messages)) for p in prompts]


def toolkit_acceptance(demo: Path, draft: Path) -> dict[str, Any]:
    """`curator eval`'s figures for `draft` on the held-out prompts (greedy, STEPS, MAX_NEW_TOKENS)."""
    from curator.evaluation.measure import measure
    from curator.mix.prompts import mix_prompts
    from training.eval.evaluate import load_target
    from training.eagle3.load import load_draft

    prompts, _ = mix_prompts(demo / "mix" / ".heldout")
    target, tokenizer = load_target(demo / "target")
    drafter = load_draft(draft, demo / "target")
    report = measure(target, tokenizer, drafter, prompts, steps=STEPS, max_new_tokens=MAX_NEW_TOKENS, tie_margin=1e-4)
    data = report.to_json()
    return {"acceptance_length": data["acceptance_length"],
            "per_position": [r["rate"] for r in data["overall"]["per_position"]], "tokens": data["new_tokens"]}


def engine_acceptance(server: VllmServer, prompts: list[tuple[str, list[int]]]) -> dict[str, Any]:
    """The engine's own figures: its /metrics counters across greedy completions of `prompts`, one at a time."""
    from curator.engines import vllm

    before = vllm.spec_counters(server.metrics())
    tokens = 0
    for _, ids in prompts:
        answer = server.post("/v1/completions", {"model": server.served_name, "prompt": ids, "max_tokens": MAX_NEW_TOKENS,
                                                 "temperature": 0.0, "return_token_ids": True})
        tokens += len(answer["choices"][0]["token_ids"])
    counted = vllm.spec_counters(server.metrics()).minus(before)
    return {"acceptance_length": counted.acceptance_length, "per_position": counted.position_rates(),
            "drafts": counted.drafts, "tokens": tokens}




# ---------------------------------------------------------------- sampled verification: the noise of two samples


def ratio_and_se(clusters: list[tuple[float, float]]) -> tuple[float, float]:
    """Return (sum of x / sum of d, its standard error) over clusters (d_i, x_i): here one sequence's
    drafts and accepted tokens. The error is the cluster-robust (delta-method) one of a ratio
    estimator, so drafts of one sequence may depend on each other; sequences are independent draws."""
    n = len(clusters)
    d = sum(c[0] for c in clusters)
    r = sum(c[1] for c in clusters) / d
    var = n / (n - 1) * sum((x - r * di) ** 2 for di, x in clusters) / d**2
    return r, var**0.5
