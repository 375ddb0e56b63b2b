"""A local OpenAI-compatible server on 127.0.0.1 that answers what a test scripts, byte for byte:
bodies that are not valid Unicode once parsed, nested too deep, larger than any answer should be,
or sent one byte at a time. For the tests that hold generation to "a bad answer is one counted row
error, and nothing else is lost".

    with HostileServer(lambda req: Reply(raw_json)) as server: server.url

`script(request)` gets each chat request body (dict) and returns a Reply; the client's one-token
start-up check is answered normally. Every request's headers are kept (`seen_headers`), so a test
can check what credentials arrived. FakeOpenAIServer's connection loop and lifecycle; stdlib only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakes.openai_server import FakeOpenAIServer


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


class HostileServer(FakeOpenAIServer):
    """Serves `script`'s replies (FakeOpenAIServer's loop and lifecycle, its own answers)."""

    def __init__(self, script: Callable[[dict[str, Any]], Reply], *, model: str = "target") -> None:
        super().__init__(model=model, record=False)
        self.script = script
        self.seen_headers: list[dict[str, str]] = []

    async def _respond(self, writer: asyncio.StreamWriter, method: str, path: str, headers: dict[str, str],
                       body: bytes) -> bool:
        self.seen_headers.append(headers)
        await self._answer(writer, self._reply(method, path, body))
        return True

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
