"""A local server on 127.0.0.1 that plays vLLM's part in `extract_hidden_states` mode, for tests.

It tokenises nothing: /v1/completions takes the prompt as token ids, runs a transformers model on
exactly those ids, and answers like vLLM with `kv_transfer_params.hidden_states_path` and
`choices[0].prompt_token_ids`. As vLLM's ExampleHiddenStatesConnector does, it creates
`path + ".lock"` holding an exclusive flock before it answers, and writes {hidden_states
[seq, n_layers, H] (bf16, the model's serving dtype), token_ids [seq]} as safetensors into its
shared directory AFTER the answer has gone, on another thread (`write_delay_s` later), releasing
the lock once the file is whole. A reader that does not wait for the lock sees no file, or half
of one.

Layer ids follow vLLM: id L < N is the residual stream entering layer L (transformers'
hidden_states[L]); id N is the last layer's output before the final norm. The states are computed
here with `output_hidden_states` and a hook on the last layer, independently of the toolkit's
own capture code.

Faults, for the failure tests (`fault=`): "truncate" (half a file), "missing" (no file),
"wrong_layers" (one layer too few), "wrong_ids" (echoes other prompt ids), "hidden_dir" (reports
a path under a directory the client cannot see), "flaky" (`flaky_status`, 503 by default, on the
first `flaky` requests); `answer_delay_s` makes a slow engine.
A request with an X-Request-Id header is named as vLLM 0.32 names it: `cmpl-<id>-0-<8 hex>`.
A hostile engine: `report(path)` returns what the answer names instead of the file it wrote.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save
from transformers import AutoModelForCausalLM


class FakeVllmServer:
    """Serves one model; `with FakeVllmServer(model_dir, shared_dir, layer_ids) as s: s.url`."""

    def __init__(
        self,
        model_dir: str | Path,
        shared_dir: str | Path,
        layer_ids: list[int],
        *,
        served_name: str | None = None,
        fault: str | None = None,
        flaky: int = 0,
        flaky_status: int = 503,
        answer_delay_s: float = 0.0,
        write_delay_s: float = 0.05,
        report: Callable[[Path], str] | None = None,
    ) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.shared = Path(shared_dir)
        self.shared.mkdir(parents=True, exist_ok=True)
        self.layer_ids = list(layer_ids)
        self.served_name = served_name or str(model_dir)
        self.fault = fault
        self.flaky = flaky
        self.flaky_status = flaky_status
        self.answer_delay_s = answer_delay_s
        self.write_delay_s = write_delay_s
        self.report = report
        self.writers: list[threading.Thread] = []
        self._writers_lock = threading.Lock()
        self._closing = False
        self.requests = 0
        self.prompts: list[list[int]] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()  # hooks are per model, so forwards run one at a time
        self._httpd: ThreadingHTTPServer | None = None
        self.url = ""

    def __enter__(self) -> FakeVllmServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.served_name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                status, answer, write = server.complete(body, self.headers.get("X-Request-Id"))
                self._send(status, answer)
                if write is not None:  # as vLLM: the file is written after the answer has gone
                    server.start_writer(write)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def start_writer(self, write: Callable[[], None]) -> None:
        """Run `write` on a thread that __exit__ waits for. A thread joins only once started, so it
        is started before it is listed, under the lock __exit__ takes to stop new ones."""
        with self._writers_lock:
            if self._closing:
                return
            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            self.writers.append(writer)

    def __exit__(self, *exc: object) -> None:
        with self._writers_lock:
            self._closing = True
            writers = list(self.writers)
        for writer in writers:
            writer.join(timeout=10)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    @torch.no_grad()
    def states(self, ids: list[int]) -> torch.Tensor:
        """Return [seq, n_layers, H] for the layer ids, vLLM's numbering."""
        x = torch.tensor([ids])
        n = self.model.config.num_hidden_layers
        last: dict[str, torch.Tensor] = {}
        hook = self.model.model.layers[n - 1].register_forward_hook(lambda m, a, o: last.__setitem__("out", o))
        try:
            out = self.model(input_ids=x, output_hidden_states=True)
        finally:
            hook.remove()
        picked = [last["out"][0] if i == n else out.hidden_states[i][0] for i in self.layer_ids]
        return torch.stack(picked, dim=1).to(torch.bfloat16)

    def complete(self, body: dict[str, Any], request_id: str | None = None
                 ) -> tuple[int, dict[str, Any], Callable[[], None] | None]:
        """Return (status, answer, the file write to run once the answer is sent)."""
        with self._lock:
            self.requests += 1
            n_req = self.requests
            rid = next(self._ids)
        if self.answer_delay_s:
            time.sleep(self.answer_delay_s)
        if n_req <= self.flaky:
            return self.flaky_status, {"error": {"message": "engine busy"}}, None
        if body.get("model") != self.served_name:
            return 404, {"error": {"message": f"model {body.get('model')} does not exist"}}, None
        ids = body.get("prompt")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return 400, {"error": {"message": "this fake takes token ids only"}}, None
        with self._lock:
            self.prompts.append(list(ids))
        with self._model_lock:
            hs = self.states(ids)
        if self.fault == "wrong_layers":
            hs = hs[:, :-1]
        name = f"cmpl-{request_id}-0-{os.urandom(4).hex()}" if request_id else f"cmpl-{rid}"
        path = self.shared / f"{name}.safetensors"
        # the lock exists, held, before the client can learn the path
        lock_fd = os.open(f"{path}.lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)

        def write() -> None:
            try:
                time.sleep(self.write_delay_s)
                if self.fault == "missing":
                    return
                tensors = {"hidden_states": hs.contiguous(), "token_ids": torch.tensor(ids)}
                with open(path, "wb") as f:  # in place and in pieces, as a large write is seen by a reader
                    data = save(tensors)
                    cut = len(data) // 2
                    f.write(data[:cut])
                    f.flush()
                    time.sleep(self.write_delay_s)
                    if self.fault != "truncate":
                        f.write(data[cut:])
            finally:
                os.close(lock_fd)  # releases the exclusive lock

        reported = str(path)
        if self.fault == "hidden_dir":
            reported = f"/nonexistent-engine-volume/{path.name}"
        if self.report is not None:
            reported = self.report(path)
        echoed = list(ids) if self.fault != "wrong_ids" else list(ids[:-1])
        answer = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                         "prompt_token_ids": echoed, "token_ids": [0]}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1},
            "kv_transfer_params": {"hidden_states_path": reported},
        }
        return 200, answer, write
