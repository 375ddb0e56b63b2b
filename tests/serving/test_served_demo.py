"""`curator demo --serve` against a real vLLM: the demo ends by serving its own draft in the engine
and prints the engine's acceptance beside `curator eval`'s (greedy, the same held-out prompts and
lengths, so they are equal when the engine serves the draft as trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_the_demo_serves_its_draft_and_prints_the_engines_acceptance(demo: Path, vllm_env: str) -> None:
    from curator.cli import main
    from curator.ui import console

    with console.capture() as printed:  # the demo prints through rich's console
        assert main(["demo", "--quick", "--serve", "--workdir", str(demo)]) == 0  # earlier stages: the fixture's
    out = printed.get()
    assert "acceptance length, served by vLLM" in out and "(curator eval:" in out
    state = json.loads((demo / "demo-state.json").read_text())
    served = next(s for s in state["stages"] if s["name"] == "serve (vLLM)")["figures"]
    print(json.dumps(served, indent=1))
    engine, ours = served["acceptance length, vLLM (K=3)"], served["acceptance length, curator eval (K=3)"]
    assert served["drafts"] > 0 and served["engine"].startswith("vLLM 0.32.0")
    assert engine == pytest.approx(ours, rel=0.02)
