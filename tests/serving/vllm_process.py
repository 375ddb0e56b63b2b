"""A real vLLM OpenAI-compatible server as a child process of the tests, on 127.0.0.1.

The server runs in vLLM's own virtual environment (`.ci/vllm.sh` builds it; `CURATOR_VLLM_PYTHON`
names its python), the tests in the main one, so the toolkit meets vLLM over HTTP only, as a user's
does. Each server is started in a process group of its own and always stopped as a group (SIGTERM,
then SIGKILL): vLLM's engine core runs in a child process that would outlive its API server.

A server that does not come up fails the test with its own output (the tail of its log), never a
skip: where `CURATOR_VLLM_PYTHON` is set, a missing engine is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from curator.engines.local_vllm import MODULE, cpu_env, free_port, server_argv, stop_group, wait_healthy

ENV = "CURATOR_VLLM_PYTHON"
SKIP_REASON = (f"{ENV} is not set: the real-engine tests need vLLM's CPU build "
               f"(`export {ENV}=$(bash .ci/vllm.sh)`)")
# vLLM's CPU start-up on a busy 2-core machine: imports, the model, the KV cache and a warm-up
# (measured 40-150 s here; a draft adds its own load); generous, since a slow start is not a fault.
START_TIMEOUT_S = float(os.environ.get("CURATOR_VLLM_START_TIMEOUT", "600"))
LOG_TAIL = 6000


def vllm_python() -> str:
    """Return the python of vLLM's environment; skip (with the reason) when none is configured."""
    python = os.environ.get(ENV)
    if not python:
        pytest.skip(SKIP_REASON)
    if not Path(python).is_file():
        pytest.fail(f"{ENV}={python} is not a file: run `bash .ci/vllm.sh`")
    return python


def engine_env(**extra: str) -> dict[str, str]:
    """Return the environment of a test server: the toolkit's CPU one (curator.engines.local_vllm), the
    CPU platform whatever the machine has, one OpenMP thread per server (two servers and the tests
    share 2 cores), and `extra`."""
    env = cpu_env(**{"VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": "1", **extra})
    return {k: v for k, v in env.items() if not k.startswith("CUDA_")}


class VllmServer:
    """`with VllmServer(model, log_dir, [...extra flags]) as s: s.url` serves `model` on 127.0.0.1."""

    def __init__(self, model: str | Path, log_dir: str | Path, args: Sequence[str] = (), *,
                 served_name: str = "target", max_model_len: int = 1024, max_num_seqs: int = 4,
                 module: str = MODULE, env: dict[str, str] | None = None,
                 python_args: Sequence[str] = (), port: int | None = None) -> None:
        self.python = vllm_python()
        self.model = str(model)
        self.served_name = served_name
        self.port = port or free_port()  # a restarted server takes its predecessor's port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"vllm-{self.port}-{time.monotonic_ns()}.log"
        self.argv = server_argv(self.python, model, self.port, served_name=served_name,
                                max_model_len=max_model_len, max_num_seqs=max_num_seqs, module=module,
                                python_args=python_args, args=args)
        self.env = engine_env(**(env or {}))
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True, cwd=self.log_path.parent)
        finally:
            log.close()
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        """Wait for /health; the server's own error output as the failure when it exits or never answers."""
        assert self.proc is not None
        why = wait_healthy(self.proc, self.url, timeout_s)
        if why is not None:
            raise ServerFailed(why, self)
        return self

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after 30 s)."""
        stop_group(self.proc)

    def __enter__(self) -> VllmServer:
        if self.proc is not None:  # already started (start_or_fail): one process per server, never two
            return self
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading it

    def log_tail(self, chars: int = LOG_TAIL) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-chars:]

    def post(self, path: str, body: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
        r = httpx.post(f"{self.url}{path}", json=body, timeout=timeout)
        if r.status_code != 200:
            raise ServerFailed(f"POST {path} answered {r.status_code}: {r.text[:2000]}", self)
        return r.json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text


class ServerFailed(AssertionError):
    """The engine did not do what the test needs; the message carries the engine's own output."""

    def __init__(self, what: str, server: VllmServer) -> None:
        super().__init__(f"{what}\ncommand: {json.dumps(server.argv)}\n--- vLLM's output "
                         f"({server.log_path}) ---\n{server.log_tail()}")


def start_or_fail(server: VllmServer) -> VllmServer:
    """Start `server` and wait for it; a test failure with vLLM's own output when it does not serve."""
    try:
        return server.__enter__()
    except ServerFailed as exc:
        pytest.fail(str(exc), pytrace=False)


def start_all_or_fail(*servers: VllmServer) -> tuple[VllmServer, ...]:
    """Start `servers` side by side (a start is mostly one core importing vLLM), then wait for each;
    when one does not serve, all are stopped and the test fails with that server's own output."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
    except BaseException as exc:
        for server in servers:
            server.stop()
        if isinstance(exc, ServerFailed):
            pytest.fail(str(exc), pytrace=False)
        raise
    return servers
