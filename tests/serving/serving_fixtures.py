"""Fixtures of the real-engine tests: the quick demo's target and draft, and vLLM servers on them.

The tests make their own models: `curator demo --quick` trains a small Llama target (its own BPE
tokenizer and chat template with tool-call tokens), regenerates its mix, captures states, trains
and exports an EAGLE-3 draft. `CURATOR_SERVING_WORKDIR` names a folder to keep it in between runs
(the demo redoes only unfinished stages there); by default it lives in pytest's temporary folder.

(A module, not a conftest.py: tests/conftest.py is imported as `conftest` by other tests.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
    from training.export import export_checkpoint

    out = demo / "export-speculators"
    if not (out / "config.json").is_file():
        export_checkpoint(demo / "run", out, fmt="speculators")
    return out


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="module")
def target_server(demo: Path, logs: Path) -> Iterator[VllmServer]:
    """vLLM serving the demo's target without speculation (stopped after the module)."""
    server = start_or_fail(VllmServer(demo / "target", logs, max_num_seqs=8))
    try:
        yield server
    finally:
        server.stop()
