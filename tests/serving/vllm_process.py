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
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

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


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_env(**extra: str) -> dict[str, str]:
    """Return the environment of a vLLM server: CPU, small KV cache, no thread pinning, offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "CUDA_"))}
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: the tiny targets need a few MiB; the machine is shared
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # do not pin cores other engineers' jobs use
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


class VllmServer:
    """`with VllmServer(model, log_dir, [...extra flags]) as s: s.url` serves `model` on 127.0.0.1."""

    def __init__(self, model: str | Path, log_dir: str | Path, args: Sequence[str] = (), *,
                 served_name: str = "target", max_model_len: int = 1024, max_num_seqs: int = 4,
                 module: str = "vllm.entrypoints.openai.api_server", env: dict[str, str] | None = None,
                 python_args: Sequence[str] = (), port: int | None = None) -> None:
        self.python = vllm_python()
        self.model = str(model)
        self.served_name = served_name
        self.port = port or free_port()  # a restarted server takes its predecessor's port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"vllm-{self.port}-{time.monotonic_ns()}.log"
        self.argv = [self.python, *python_args, "-m", module, "--model", self.model,
                     "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(self.port),
                     "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
                     "--dtype", "float32", "--seed", "0", "--uvicorn-log-level", "warning",
                     # no torch.compile: on 2 busy cores it took minutes per start for models of 1 MB
                     "--enforce-eager",
                     # the worker inside the engine-core process: on the CPU vLLM otherwise starts a
                     # third process that imports vLLM and torch again (40 of a start's 100 s here)
                     "--distributed-executor-backend", "uni", *args]
        # vLLM's CPU platform turns "uni" back into "mp" unless this is 0; the API server still runs
        # the engine core in a process of its own (AsyncLLM always does)
        self.env = engine_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", **(env or {}))
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
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerFailed(f"vLLM exited with status {self.proc.returncode} before it served", self)
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise ServerFailed(f"vLLM did not answer /health within {timeout_s:.0f} s", self)

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after 30 s)."""
        if self.proc is None or self.proc.poll() is not None and not _group_alive(self.proc.pid):
            return
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(self.proc.pid):
                if self.proc.poll() is None:
                    try:
                        self.proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.2)
            if not _group_alive(self.proc.pid):
                break

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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
