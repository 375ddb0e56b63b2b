"""Local stand-ins for serving engines with speculative decoding, on 127.0.0.1, for `bench-serve` tests.

They speak the HTTP the real engines speak and publish acceptance in the engines' own fields:

- SGLang: `POST /generate` ({"input_ids" | "text", "sampling_params": {"max_new_tokens"}, "stream"}),
  streamed as `data: {...}` events with `meta_info` (`id`, `completion_tokens`, `finish_reason`,
  `e2e_latency`, and `spec_verify_ct` only when the server speculates) and `data: [DONE]`.
- vLLM: `POST /v1/chat/completions` (stream, `stream_options.include_usage`), `GET /v1/models`, and
  `GET /metrics` with prometheus_client's exposition of `vllm:spec_decode_num_drafts`,
  `..._num_draft_tokens`, `..._num_accepted_tokens` and `..._num_accepted_tokens_per_pos`
  (`_total` and `_created` samples, labels `engine`, `model_name`, `position`).

Decoding is simulated: every request produces exactly the tokens asked for; a speculating server
accepts, cycle by cycle, draft tokens whose running mean is the configured acceptance length
(a function of the prompt, so categories can differ), and spends `step_s` per target forward plus
`draft_step_s` per drafted token. A server without the draft spends `step_s` per token.

    with FakeServingServer("sglang", acceptance=2.5) as server:
        server.url
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Acceptance = Callable[[Any], float]


class FakeServingServer:
    """An SGLang- or vLLM-speaking server on a free local port (see module doc)."""

    def __init__(self, engine: str, *, speculative: bool = True, acceptance: float | Acceptance = 2.0,
                 num_spec_tokens: int = 3, step_s: float = 0.002, draft_step_s: float = 0.0005,
                 model: str = "served-target") -> None:
        if engine not in ("sglang", "vllm"):
            raise ValueError(engine)
        self.engine, self.speculative, self.k, self.model = engine, speculative, num_spec_tokens, model
        self.acceptance: Acceptance = acceptance if callable(acceptance) else (lambda _prompt, a=acceptance: a)
        self.step_s, self.draft_step_s = step_s, draft_step_s
        self.lock = threading.Lock()
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * num_spec_tokens
        self.requests = 0
        self.bodies: list[dict[str, Any]] = []  # every generation request's JSON body, as received
        self.in_flight = self.max_in_flight = 0
        self.created = time.time()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeServingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the simulated decoding -------------------------------------------------------------

    def cycles(self, prompt: Any, tokens: int) -> list[int]:
        """Return the tokens each target forward yields for a request (accepted drafts + 1)."""
        if not self.speculative:
            return [1] * tokens
        extra = min(max(self.acceptance(prompt), 1.0), self.k + 1) - 1.0  # mean accepted drafts per cycle
        out, done, i = [], 0, 0
        while done < tokens:
            a = min(int((i + 1) * extra + 1e-9) - int(i * extra + 1e-9), self.k, tokens - done - 1)
            out.append(a + 1)
            done += a + 1
            i += 1
        return out

    def count(self, cycles: list[int]) -> None:
        with self.lock:
            self.requests += 1
            if not self.speculative:
                return
            for n in cycles:
                self.drafts += 1
                self.draft_tokens += self.k
                self.accepted += n - 1
                for pos in range(n - 1):
                    self.per_pos[pos] += 1

    def step_time(self) -> float:
        return self.step_s + (self.k * self.draft_step_s if self.speculative else 0.0)

    def metrics_text(self) -> str:
        """Return the /metrics page: vLLM's spec-decode counters as prometheus_client writes them."""
        labels = f'engine="0",model_name="{self.model}"'
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 "# TYPE vllm:num_requests_running gauge",
                 f"vllm:num_requests_running{{{labels}}} {float(self.in_flight)}"]
        if self.speculative:
            with self.lock:
                counters = [("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", self.drafts),
                            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", self.draft_tokens),
                            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", self.accepted)]
                per_pos = list(self.per_pos)
            for name, doc, value in counters:
                lines += [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter",
                          f"{name}_total{{{labels}}} {float(value)}", f"{name}_created{{{labels}}} {self.created}"]
            name = "vllm:spec_decode_num_accepted_tokens_per_pos"
            lines += [f"# HELP {name}_total Accepted tokens per draft position.", f"# TYPE {name}_total counter"]
            for pos, value in enumerate(per_pos):
                lines.append(f'{name}_total{{{labels},position="{pos}"}} {float(value)}')
        return "\n".join(lines) + "\n"

    # -- HTTP --------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, body: Any, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _event(self, payload: Any) -> None:
                data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def do_GET(self) -> None:
                if fake.engine == "vllm" and self.path == "/metrics":
                    self._json(200, fake.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
                elif fake.engine == "vllm" and self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._json(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if fake.engine == "sglang" and self.path == "/generate":
                    prompt = body.get("input_ids", body.get("text"))
                    tokens = int((body.get("sampling_params") or {}).get("max_new_tokens", 128))
                elif fake.engine == "vllm" and self.path == "/v1/chat/completions":
                    if body.get("model") != fake.model:
                        self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                        return
                    prompt = body.get("messages")
                    tokens = int(body.get("max_tokens", 128))
                else:
                    self._json(404, {"error": f"no route {self.path}"})
                    return
                with fake.lock:
                    fake.bodies.append(body)
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    self._stream(prompt, tokens, body)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

            def _stream(self, prompt: Any, tokens: int, body: dict[str, Any]) -> None:
                start = time.perf_counter()
                cycles = fake.cycles(prompt, tokens)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                rid = f"req-{id(self):x}"
                if fake.engine == "vllm":
                    self._event({"id": rid, "object": "chat.completion.chunk", "model": fake.model,
                                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                done = 0
                for i, n in enumerate(cycles):
                    time.sleep(fake.step_time())
                    done += n
                    last = i == len(cycles) - 1
                    if fake.engine == "sglang":
                        meta: dict[str, Any] = {"id": rid, "completion_tokens": done,
                                                "finish_reason": {"type": "length", "length": done} if last else None,
                                                "e2e_latency": time.perf_counter() - start}
                        if fake.speculative:
                            meta["spec_verify_ct"] = i + 1
                        self._event({"text": "tok " * done, "meta_info": meta})
                    else:
                        self._event({"id": rid, "object": "chat.completion.chunk", "model": fake.model,
                                     "choices": [{"index": 0, "delta": {"content": "tok " * n},
                                                  "finish_reason": "length" if last else None}]})
                if fake.engine == "vllm" and (body.get("stream_options") or {}).get("include_usage"):
                    self._event({"id": rid, "object": "chat.completion.chunk", "model": fake.model, "choices": [],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": done, "total_tokens": 10 + done}})
                fake.count(cycles)
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler
