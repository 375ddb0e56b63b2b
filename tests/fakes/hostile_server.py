"""A local OpenAI-compatible server on 127.0.0.1 that answers what a test scripts, byte for byte:
bodies that are not valid Unicode once parsed, nested too deep, larger than any answer should be,
or sent one byte at a time. For the tests that hold generation to "a bad answer is one counted row
error, and nothing else is lost".

    with HostileServer(lambda req: Reply(raw_json)) as server: server.url

`script(request)` gets each chat request body (dict) and returns a Reply; the client's one-token
start-up check is answered normally. Every request's headers are kept (`seen_headers`), so a test
can check what credentials arrived. Stdlib only.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    """One scripted answer: the raw body, its status, and how it is sent."""

    body: bytes
    status: int = 200
    drip_s: float = 0.0  # > 0: one byte of the body every drip_s seconds
    chunked: bool = False  # no Content-Length: the client cannot know the size in advance


def chat_answer(content: str, model: str = "target") -> bytes:
    """Return the raw body of a chat completion whose message content is `content` (JSON-escaped,
    so a lone surrogate travels as the \\udXXX escape a real server sends)."""
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }).encode("ascii")


class HostileServer:
    """Serves `script`'s replies on a background thread's event loop."""

    def __init__(self, script: Callable[[dict[str, Any]], Reply], *, model: str = "target") -> None:
        self.script = script
        self.model = model
        self.seen_headers: list[dict[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """Return the base URL."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HostileServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()  # connections still dripping or streaming

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                self.seen_headers.append(headers)
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                await self._answer(writer, self._reply(method, path, body))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _reply(self, method: str, path: str, body: bytes) -> Reply:
        if method == "GET" and path.startswith("/v1/models"):
            return Reply(json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]}).encode())
        request = json.loads(body or b"{}")
        if request.get("max_tokens") == 1:  # the client's start-up check
            return Reply(chat_answer("OK", self.model))
        return self.script(request)

    async def _answer(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        head = [f"HTTP/1.1 {reply.status} X", "Content-Type: application/json"]
        head.append("Transfer-Encoding: chunked" if reply.chunked else f"Content-Length: {len(reply.body)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        if reply.drip_s > 0:
            for i in range(len(reply.body)):
                writer.write(reply.body[i:i + 1])
                await writer.drain()
                await asyncio.sleep(reply.drip_s)
        elif reply.chunked:
            step = 64 * 1024
            for i in range(0, len(reply.body), step):
                piece = reply.body[i:i + step]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(reply.body)
        await writer.drain()
