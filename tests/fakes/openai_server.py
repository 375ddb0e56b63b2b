"""A local OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benchmarks.

Speaks real HTTP/1.1 (keep-alive, Content-Length bodies) on stdlib asyncio streams, so the
toolkit's real httpx client talks to it exactly as it talks to SGLang or vLLM. What it does is
scripted: a latency per request, faults (429, 500, dropped connections) handed out in order or
to prompts containing a marker, a poison marker that always gets vLLM's 400 context-length
error, reasoning in `reasoning_content` or inside <think> tags. It counts what it sees
(requests, statuses, in-flight now / at most / time-averaged) so tests can assert on it.

Run in-process (a background thread with its own event loop):

    with FakeOpenAIServer(latency=0.05) as server:
        server.url, server.stats()

or as its own process (benchmarks, so client and server each get a core):

    python tests/fakes/openai_server.py --latency 0.2      # prints the URL on stdout

Stdlib only, so it runs wherever Python does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DROP = "drop"  # a fault that closes the connection without answering

REASONS = {429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable", 400: "Bad Request"}


@dataclass
class _Counters:
    requests: int = 0
    chat_requests: int = 0
    statuses: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    dropped: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    # Time-weighted in-flight: integral of in_flight dt between the first start and the last end.
    area: float = 0.0
    first_start: float | None = None
    last_change: float = 0.0
    last_end: float = 0.0

    def enter(self) -> None:
        now = time.perf_counter()
        if self.first_start is None:
            self.first_start = now
            self.last_change = now
        self.area += self.in_flight * (now - self.last_change)
        self.last_change = now
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        now = time.perf_counter()
        self.area += self.in_flight * (now - self.last_change)
        self.last_change = now
        self.in_flight -= 1
        self.last_end = now


class FakeOpenAIServer:
    """A scripted OpenAI-compatible server; use as a context manager or call start()/stop()."""

    def __init__(
        self,
        *,
        model: str = "target",
        latency: float | Callable[[dict[str, Any]], float] = 0.0,
        faults: Sequence[int | str] = (),
        faults_by_marker: dict[str, Sequence[int | str]] | None = None,
        poison: str = "POISON",
        fault_message: str = "scripted {status}",
        reasoning: str = "none",
        record: bool = True,
        port: int = 0,
    ) -> None:
        if reasoning not in ("none", "field", "think"):
            raise ValueError("reasoning must be none, field or think")
        self.model = model
        self.latency = latency
        self.poison = poison
        self.fault_message = fault_message  # the error text of a scripted fault ({status} filled in)
        self.reasoning = reasoning
        self.record = record
        self.port = port
        self._faults = list(faults)
        self._faults_by_marker = {k: list(v) for k, v in (faults_by_marker or {}).items()}
        self._counters = _Counters()
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []  # chat request bodies, when `record`
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._connections: set[asyncio.Task[Any]] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Return the base URL (http://127.0.0.1:PORT) clients should be given."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOpenAIServer:
        """Start serving on a background thread; return self once the port is bound."""
        self._thread = threading.Thread(target=self._run_thread, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        """Stop serving (closing open connections) and join the thread."""
        if self._loop is not None and self._server is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run_thread(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self.serve())
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def serve(self) -> None:
        """Bind 127.0.0.1:port on the running loop (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    # ---- what tests read -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Return the counters: requests, chat_requests, statuses, dropped, in_flight,
        max_in_flight, avg_in_flight (time-weighted over the busy span)."""
        with self._lock:
            c = self._counters
            span = (c.last_change - c.first_start) if c.first_start is not None else 0.0
            return {
                "requests": c.requests,
                "chat_requests": c.chat_requests,
                "statuses": dict(c.statuses),
                "dropped": c.dropped,
                "in_flight": c.in_flight,
                "max_in_flight": c.max_in_flight,
                "avg_in_flight": c.area / span if span > 0 else 0.0,
            }

    def reset_stats(self) -> None:
        """Zero the counters and forget recorded requests."""
        with self._lock:
            self._counters = _Counters()
            self.requests.clear()

    # ---- HTTP ------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                if not await self._respond(writer, method, path, headers, body):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            self._connections.discard(task)
            writer.close()

    async def _respond(self, writer: asyncio.StreamWriter, method: str, path: str, headers: dict[str, str],
                       body: bytes) -> bool:
        """Answer one request (`headers` with lower-case names); return whether to keep the connection."""
        status, payload, extra = await self._route(method, path.split("?", 1)[0], body)
        if status is None:  # scripted drop: close without a word
            return False
        data = json.dumps(payload).encode()
        head_out = [f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}", "Content-Type: application/json",
                    f"Content-Length: {len(data)}"]
        head_out += [f"{k}: {v}" for k, v in extra.items()]
        writer.write(("\r\n".join(head_out) + "\r\n\r\n").encode() + data)
        await writer.drain()
        return headers.get("connection", "").lower() != "close"

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int | None, Any, dict[str, str]]:
        with self._lock:
            self._counters.requests += 1
        if method == "GET" and path in ("/v1/models", "/models"):
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]}, {}
        if method == "GET" and path == "/_stats":
            return 200, self.stats(), {}
        if method == "POST" and path == "/_reset":
            self.reset_stats()
            return 200, {"reset": True}, {}
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            return await self._chat(body)
        return 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}}, {}

    async def _chat(self, body: bytes) -> tuple[int | None, Any, dict[str, str]]:
        try:
            req = json.loads(body)
            messages = req["messages"]
        except (ValueError, KeyError, TypeError):
            return 400, {"error": {"message": "invalid JSON body", "type": "BadRequestError"}}, {}
        if req.get("model") != self.model:
            return 404, {"object": "error", "message": f"The model `{req.get('model')}` does not exist.",
                         "type": "NotFoundError", "code": 404}, {}
        last_user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") in ("user", "tool")), "")
        with self._lock:
            c = self._counters
            c.chat_requests += 1
            if self.record:
                self.requests.append(req)
            c.enter()
        try:
            latency = self.latency(req) if callable(self.latency) else self.latency
            if latency > 0:
                await asyncio.sleep(latency)
            fault = self._next_fault(last_user)
            if fault == DROP:
                with self._lock:
                    self._counters.dropped += 1
                return None, None, {}
            if fault is not None:
                status = int(fault)
                extra = {"Retry-After": "0"} if status == 429 else {}
                message = self.fault_message.replace("{status}", str(status))
                return self._status(status), {"error": {"message": message, "code": status}}, extra
            if self.poison and self.poison in last_user:
                return self._status(400), {
                    "object": "error", "type": "BadRequestError", "code": 400,
                    "message": "This model's maximum context length is 32768 tokens. However, you requested "
                               "40000 tokens in the messages. Please reduce the length of the messages.",
                }, {}
            return self._status(200), self._completion(req, messages, last_user), {}
        finally:
            with self._lock:
                self._counters.leave()

    def _status(self, status: int) -> int:
        with self._lock:
            self._counters.statuses[status] += 1
        return status

    def _next_fault(self, last_user: str) -> int | str | None:
        with self._lock:
            for marker, queue in self._faults_by_marker.items():
                if marker in last_user and queue:
                    return queue.pop(0)
            return self._faults.pop(0) if self._faults else None

    def _completion(self, req: dict[str, Any], messages: list[dict[str, Any]], last_user: str) -> dict[str, Any]:
        # The answer names its turn (how many assistant turns the history already holds) and
        # echoes the prompt, so tests can check what the target was shown.
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        content = f"answer {turn} to: {last_user[:60]}"
        reasoning = f"thinking about turn {turn}"
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens")
        finish = "stop"
        if max_tokens is not None and int(max_tokens) <= 1:
            content, reasoning, finish = "answer", "", "length"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning == "field" and reasoning:
            message["reasoning_content"] = reasoning
        elif self.reasoning == "think" and reasoning:
            message["content"] = f"<think>{reasoning}</think>\n\n{content}"
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
        return {
            "id": f"chatcmpl-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(message["content"].split()),
                      "total_tokens": prompt_tokens + len(message["content"].split())},
        }


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--model", default="target")
    args = parser.parse_args()
    server = FakeOpenAIServer(model=args.model, latency=args.latency, record=False, port=args.port)

    async def run() -> None:
        await server.serve()
        print(server.url, flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass



def write_mix(mix_dir: Any, rows: Sequence[dict[str, Any]], files: int = 1) -> Any:
    """Write `rows` as a finished build-mix folder (the mix schema of curator/rows/schema.py, split
    over `files` parquet parts, published with its manifest) for tests of this server's clients;
    return the folder. Rows may leave out source/category/turns/keep_responses (defaults: "test",
    "chat", "all", False) and may break the format, as a damaged mix would."""
    from pathlib import Path

    import pyarrow as pa

    from curator.mix.publish import write_tables
    from curator.rows.schema import SCHEMA

    full = [{"source": "test", "category": "chat", "turns": "all", "keep_responses": False, **r} for r in rows]
    out = Path(mix_dir)
    per = max(1, -(-len(full) // files))
    write_tables(out, [pa.Table.from_pylist(full[k * per:(k + 1) * per], schema=SCHEMA) for k in range(files)], "test-mix")
    return out

if __name__ == "__main__":
    _main()
