"""Local stand-ins for the token-id endpoints of SGLang and vLLM, on 127.0.0.1 over real HTTP/1.1.

The request and response fields are the engines' own (checked in their source; see
curator/generate/token_ids.py and docs/generation.md):

SGLang  POST /generate         {"input_ids", "sampling_params", "stream"}
                               -> {"text", "output_ids", "meta_info": {"id", "finish_reason":
                                   {"type", "matched"}, "prompt_tokens", "completion_tokens",
                                   "cached_tokens", "e2e_latency"}}
vLLM    POST /v1/completions   {"model", "prompt": [int], "max_tokens", "return_token_ids", ...}
                               -> {"id", "object": "text_completion", "created", "model", "choices":
                                   [{"index", "text", "logprobs", "finish_reason", "stop_reason",
                                   "token_ids", "prompt_logprobs", "prompt_token_ids"}], "usage"}
Both    GET /v1/models, POST /v1/chat/completions (the client's start-up check).

What the target "writes" is a policy: prompt text (the ids decoded) -> answer text in the target's
format, ending with its end-of-turn token; the answer's ids are the tokenizer's. As the engines do,
the end token is in the ids and left out of the text. Faults, per server: `ignore_input_ids` (an
SGLang that answers some other prompt), `garble_ids` (ids that do not decode to the text), `legacy`
(a vLLM without return_token_ids: text only), `reprompt` (a vLLM that re-tokenised the prompt).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Policy = Callable[[str], str]


class _TokenServer:
    """A threaded HTTP server answering with `policy` through `tokenizer`; records every request body."""

    engine = ""

    def __init__(self, tokenizer: Any, policy: Policy, *, model: str = "target", **faults: bool) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.model = model
        self.faults = faults
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Return the server's base URL."""
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> _TokenServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def generate(self, prompt_ids: list[int]) -> tuple[str, list[int], int]:
        """Return (text without the end token, completion ids with it, the end token id)."""
        tok = self.tokenizer
        answer = self.policy(tok.decode(prompt_ids, skip_special_tokens=False))
        ids = list(tok(answer, add_special_tokens=False)["input_ids"])
        end = ids[-1]
        text = tok.decode(ids[:-1], skip_special_tokens=False)
        if self.faults.get("garble_ids"):
            ids = [(i + 1) % len(tok) for i in ids]
        return text, ids, end

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/v1/chat/completions":
            return 200, {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()),
                         "model": self.model, "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "OK"}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
        return 404, {"object": "error", "message": f"no route {path}", "type": "NotFoundError", "code": 404}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._send(404, {"message": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server.requests.append((self.path, body))
                self._send(*server.answer(self.path, body))

        return Handler


class FakeSGLangServer(_TokenServer):
    """SGLang's native /generate: input_ids in, output_ids and meta_info out."""

    engine = "sglang"

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path != "/generate":
            return super().answer(path, body)
        prompt = body.get("input_ids")
        if not isinstance(prompt, list):
            return 400, {"object": "error", "message": "Either text or input_ids should be provided.", "code": 400}
        if self.faults.get("ignore_input_ids"):
            prompt = list(self.tokenizer(body.get("text") or "", add_special_tokens=False)["input_ids"])
        text, ids, end = self.generate(prompt)
        return 200, {"text": text, "output_ids": ids, "meta_info": {
            "id": uuid.uuid4().hex, "finish_reason": {"type": "stop", "matched": end},
            "prompt_tokens": len(prompt), "completion_tokens": len(ids), "cached_tokens": 0,
            "e2e_latency": 0.001}}


class FakeVLLMServer(_TokenServer):
    """vLLM's /v1/completions with a token-id prompt; token_ids and prompt_token_ids when return_token_ids."""

    engine = "vllm"

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path != "/v1/completions":
            return super().answer(path, body)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(i, int) for i in prompt):
            return 400, {"object": "error", "message": "prompt must be token ids here", "type": "BadRequestError",
                         "code": 400}
        text, ids, _ = self.generate(prompt)
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop",
                                  "stop_reason": None, "prompt_logprobs": None}
        if body.get("return_token_ids") and not self.faults.get("legacy"):
            echoed = prompt[:-1] if self.faults.get("reprompt") else prompt
            choice.update(token_ids=ids, prompt_token_ids=echoed)
        return 200, {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                     "model": self.model, "choices": [choice],
                     "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(ids),
                               "completion_tokens": len(ids), "prompt_tokens_details": None}}
