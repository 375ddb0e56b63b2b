"""Fixtures of the real-engine tests: the quick demo's target and draft, and vLLM servers on them.

The tests make their own models: `curator demo --quick` trains a small Llama target (its own BPE
tokenizer and chat template with tool-call tokens), regenerates its mix, captures states, trains
and exports an EAGLE-3 draft. `CURATOR_SERVING_WORKDIR` names a folder to keep it in between runs
(the demo redoes only unfinished stages there); by default it lives in pytest's temporary folder.

They live here, in one conftest.py, so that each exists once for the whole session: a fixture
imported into several test modules is a fixture of each, and a session-scoped one then runs once
per module (the demo was built, and the target served, once per module before).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving_fixtures import spec_args
from vllm_process import VllmServer, start_all_or_fail, vllm_python


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
def session_servers(demo: Path, logs: Path) -> Iterator[tuple[VllmServer, VllmServer]]:
    """The two launches most tests share, started side by side once for the session and stopped at
    its end: the demo's target without speculation, and the target with the demo's export (SGLang
    layout) as its EAGLE-3 draft. Tests read the spec server's counters around their own requests,
    one test at a time, so sharing it changes none of their figures."""
    # The demo target writes Hermes-style `<tool_call>{"name", "arguments"}</tool_call>` calls:
    # without a tool-call parser vLLM refuses every chat request that declares tools ("auto" tool
    # choice needs one).
    target = VllmServer(demo / "target", logs, ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
                        max_num_seqs=8)
    spec = VllmServer(demo / "target", logs, spec_args(demo / "export"), max_num_seqs=4, served_name="target")
    servers = start_all_or_fail(target, spec)
    try:
        yield target, spec
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="session")
def target_server(session_servers: tuple[VllmServer, VllmServer]) -> VllmServer:
    """vLLM serving the demo's target without speculation (generate's tests; bench-serve's baseline)."""
    return session_servers[0]


@pytest.fixture(scope="session")
def spec_server(session_servers: tuple[VllmServer, VllmServer]) -> VllmServer:
    """vLLM serving the demo's target with its SGLang-layout export, method eagle3, STEPS tokens."""
    return session_servers[1]
