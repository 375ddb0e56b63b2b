"""A local engine on 127.0.0.1 that answers chat and completions like vLLM, streamed (SSE, chunked)
or not, with `return_token_ids`, tool calls when tools are declared, and scripted errors; for the
tap's offline tests. Stdlib asyncio, run on its own thread.

A prompt containing ENGINE_ERROR gets a 503 with an error body and an `x-engine-error` header; a
streamed answer waits `chunk_delay` between chunks, and a stream whose client goes away is counted
in `cancelled` (the engine saw its connection close before the answer ended).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

ERROR_MARKER = "ENGINE_ERROR"
WORDS = ["The", " answer", " is", " forty", "-two", "."]


class FakeEngine:
    def __init__(self, *, chunk_delay: float = 0.0, chunks: int = 6) -> None:
        self.chunk_delay = chunk_delay
        self.chunks = chunks
        self.cancelled = 0
        self.seen_headers: list[dict[str, str]] = []
        self.seen_bodies: list[bytes] = []
        self.paths: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeEngine:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._server.close()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                self.seen_headers.append(headers)
                self.seen_bodies.append(body)
                self.paths.append(path)
                await self._answer(writer, method, path, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    @staticmethod
    def _send(writer: asyncio.StreamWriter, status: int, payload: Any, extra: str = "") -> None:
        data = json.dumps(payload).encode()
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "X")
        writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n{extra}\r\n".encode() + data)

    async def _answer(self, writer: asyncio.StreamWriter, method: str, path: str, body: bytes) -> None:
        if method == "GET":
            if path == "/v1/models":
                self._send(writer, 200, {"object": "list", "data": [{"id": "target", "object": "model"}]})
            elif path == "/metrics":
                data = b"# HELP vllm:num_requests_running x\nvllm:num_requests_running 0\n"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
            else:
                self._send(writer, 404, {"error": "not found"})
            await writer.drain()
            return
        req = json.loads(body)
        chat = path.endswith("/chat/completions")
        text = json.dumps(req.get("messages") if chat else req.get("prompt"))
        if ERROR_MARKER in text:
            self._send(writer, 503, {"object": "error", "message": "engine overloaded", "code": 503}, "x-engine-error: overloaded\r\nretry-after: 7\r\n")
            await writer.drain()
            return
        ids = bool(req.get("return_token_ids"))
        tools = bool(req.get("tools"))
        pieces = (WORDS * 10)[: self.chunks]
        if not req.get("stream"):
            if chat:
                msg: dict[str, Any] = {"role": "assistant", "content": "".join(pieces), "reasoning_content": "thinking"}
                if tools:
                    msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
                choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": "tool_calls" if tools else "stop"}
            else:
                choice = {"index": 0, "text": "".join(pieces), "finish_reason": "length"}
            if ids:
                choice["token_ids"] = list(range(100, 100 + len(pieces)))
                if not chat:
                    choice["prompt_token_ids"] = [1, 2, 3]
            payload: dict[str, Any] = {"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion", "model": req.get("model"),
                                       "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": len(pieces)}}
            if ids and chat:
                payload["prompt_token_ids"] = [1, 2, 3]
            self._send(writer, 200, payload)
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")

        def event(obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(b"%x\r\n" % len(data) + data + b"\r\n")

        try:
            first: dict[str, Any] = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            if ids:
                first["prompt_token_ids"] = [1, 2, 3]
            event(first)
            await writer.drain()
            for n, piece in enumerate(pieces):
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                if chat and tools:
                    call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
                    if n == 0:
                        call.update(id="call_1", type="function", function={"name": "get_weather", "arguments": piece})
                    delta: dict[str, Any] = {"tool_calls": [call]}
                elif chat:
                    delta = {"content": piece}
                c: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None} if chat else {"index": 0, "text": piece, "finish_reason": None}
                if ids:
                    c["token_ids"] = [100 + n]
                event({"id": "c", "choices": [c]})
                await writer.drain()
            last: dict[str, Any] = {"index": 0, "finish_reason": "tool_calls" if chat and tools else "stop"}
            end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
            last.update(end)
            event({"id": "c", "choices": [last], "usage": {"prompt_tokens": 3, "completion_tokens": len(pieces)}})
            event(b"[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            self.cancelled += 1
            raise ConnectionResetError from None
