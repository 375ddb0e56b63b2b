"""Fixtures of the real-engine tests: the quick demo's target and draft, and vLLM servers on them.

The tests make their own models: `curator demo --quick` trains a small Llama target (its own BPE
tokenizer and chat template with tool-call tokens), regenerates its mix, captures states, trains
and exports an EAGLE-3 draft. `CURATOR_SERVING_WORKDIR` names a folder to keep it in between runs
(the demo redoes only unfinished stages there); by default it lives in pytest's temporary folder.

(A module, not a conftest.py: tests/conftest.py is imported as `conftest` by other tests.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_process import VllmServer, start_or_fail, vllm_python


@pytest.fixture(scope="session")
def vllm_env() -> str:
    """vLLM's python; skips (with the reason) outside CI's real-engine run, never inside it."""
    return vllm_python()


@pytest.fixture(scope="session")
def demo(vllm_env: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick demo's workdir: target/, export/ (SGLang layout), run/ (the checkpoint), mix/, ..."""
    import torch

    from curator.demo.pipeline import QUICK, run_demo

    work = Path(os.environ.get("CURATOR_SERVING_WORKDIR") or tmp_path_factory.mktemp("serving") / "demo")
    threads = torch.get_num_threads()
    try:
        run_demo(work, QUICK)
    finally:
        torch.set_num_threads(threads)
    return work


@pytest.fixture(scope="session")
def speculators_export(demo: Path) -> Path:
    """The demo's draft exported again in the speculators layout."""
    from training.export.export import export_checkpoint

    out = demo / "export-speculators"
    if not (out / "config.json").is_file():
        export_checkpoint(demo / "run", out, fmt="speculators")
    return out


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def target_server(demo: Path, logs: Path) -> Iterator[VllmServer]:
    """vLLM serving the demo's target without speculation (one for the session, stopped at its end; bench-serve's baseline too). The demo target
    writes Hermes-style `<tool_call>{"name", "arguments"}</tool_call>` calls: without a tool-call parser
    vLLM refuses every chat request that declares tools ("auto" tool choice needs one)."""
    server = start_or_fail(VllmServer(demo / "target", logs, ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
                                      max_num_seqs=8))
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- acceptance, the toolkit's and the engine's

STEPS = 3  # draft tokens per step, the demo's eval setting
MAX_NEW_TOKENS = 32


def spec_args(draft: Path, steps: int = STEPS, method: str = "eagle3") -> list[str]:
    return ["--speculative-config", json.dumps({"method": method, "model": str(draft), "num_speculative_tokens": steps})]


def heldout_prompt_ids(demo: Path) -> list[tuple[str, list[int]]]:  # noqa: F811
    """The held-out traffic prompts `curator eval` decodes in the demo, as the ids it renders."""
    from curator.mix.prompts import mix_prompts
    from training.eval.evaluate import load_target
    from training.eval.prompts import render_prompt

    prompts, _ = mix_prompts(demo / "mix" / ".heldout")
    _, tokenizer = load_target(demo / "target")
    return [(p.id, render_prompt(tokenizer, p.messages)) for p in prompts]


def toolkit_acceptance(demo: Path, draft: Path) -> dict[str, Any]:  # noqa: F811
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


