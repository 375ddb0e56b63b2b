"""The tap's connections to the engine: kept alive, sent again once when the engine closed one while
it sat idle, never sent again once an answer began."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from curator.tap.upstream import EngineError, EnginePool


class ClosingEngine:
    """Answers each connection's first request with 200 (no `Connection: close`), then closes it, as
    an engine's keep-alive timeout does between two requests; `broken` makes it close mid-answer."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken
        self.connections = 0
        self.requests = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._run, daemon=True).start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        async def serve() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await server.serve_forever()

        self._loop.run_until_complete(serve())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        self.requests += 1
        if self.broken:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()


async def _post(pool: EnginePool) -> bytes:
    response = await pool.send(b"POST", b"/v1/chat/completions", [(b"content-type", b"application/json")], b"{}")
    try:
        return b"".join([chunk async for chunk in response.chunks()])
    finally:
        response.close()


def test_a_connection_the_engine_closed_while_idle_is_replaced():
    engine = ClosingEngine()

    async def run() -> list[bytes]:
        pool = EnginePool(f"http://127.0.0.1:{engine.port}")
        out = []
        for _ in range(3):
            out.append(await _post(pool))
            await asyncio.sleep(0.05)  # the engine closes the kept-alive connection meanwhile
        # a kept connection whose close the pool has not seen yet: the request fails before any answer and
        # goes out again on a new connection
        dead = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        stale = await EnginePool(f"http://127.0.0.1:{dead.sockets[0].getsockname()[1]}")._connect()
        await asyncio.sleep(0.05)
        stale.reader.at_eof = lambda: False  # type: ignore[method-assign]  # as if its close were still on the way
        pool._idle.append(stale)
        out.append(await _post(pool))
        dead.close()
        await pool.aclose()
        return out

    assert asyncio.run(run()) == [b"{}"] * 4
    assert engine.requests == 4 and engine.connections == 4  # each request reached the engine once


def test_an_answer_cut_short_is_an_engine_error_never_sent_again():
    engine = ClosingEngine(broken=True)

    async def run() -> None:
        pool = EnginePool(f"http://127.0.0.1:{engine.port}")
        with pytest.raises(EngineError, match="mid-answer"):
            await _post(pool)
        await pool.aclose()

    asyncio.run(run())
    assert engine.requests == 1


def test_an_engine_that_is_not_there_is_a_connect_error():
    pool = EnginePool("http://127.0.0.1:9", connect_s=2)
    with pytest.raises(EngineError, match="ConnectError"):
        asyncio.run(_post(pool))


def test_the_path_prefix_and_host_of_the_engine_address_are_sent(engine):
    async def run() -> bytes:
        pool = EnginePool(engine.url + "/")
        out = await _post(pool)
        await pool.aclose()
        return out

    assert httpx.Response(200, content=asyncio.run(run())).json()["choices"]
    assert engine.paths[-1] == "/v1/chat/completions" and engine.seen_headers[-1]["host"] == f"127.0.0.1:{engine.port}"
