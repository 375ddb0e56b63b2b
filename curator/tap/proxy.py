"""The tap's HTTP/1.1 server: every request is forwarded to the engine unchanged, every answer
comes back unchanged (status, headers, bytes), and the sampled chat/completions exchanges are
handed to the writer after the client has its answer.

Built on asyncio streams with h11 on both sides (the HTTP/1.1 parser httpx itself runs on, so
nothing new is installed; the engine side is curator/tap/upstream.py). The request path does no
parsing of its own: a coin flip decides sampling, and a sampled answer's chunks are kept by
reference as they are forwarded; the writer parses, scrubs and writes them later, in its own
process. A client that goes away cancels the engine's request (the connection to the engine is
closed, which SGLang and vLLM take as an abort) and the record is marked incomplete. The only answer the tap makes itself is a 502 when
the engine cannot be reached at all, and `GET /tap/stats` (its counters, as JSON).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from typing import Any

import h11

from curator.tap.record import ENDPOINTS, Exchange
from curator.tap.upstream import EnginePool, EngineError, EngineResponse
from curator.tap.writer import TapWriter

STATS_PATH = b"/tap/stats"
# hop-by-hop headers (RFC 9110 7.6.1) belong to one connection: neither forwarded nor copied back;
# framing (content-length, transfer-encoding) is made again by each side's own HTTP layer
_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization", b"te",
        b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length"}
_READ = 65536


class TapProxy:
    """`await TapProxy(engine_url, writer).serve(host, port)`; `rate` is the share of chat/completions requests recorded."""

    def __init__(self, engine: str, writer: TapWriter | None, *, rate: float = 1.0, seed: int | None = None,
                 connect_s: float = 10.0, on_listen: Callable[[str, int], None] | None = None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate must be between 0 and 1")
        self.engine = engine.rstrip("/")
        self.writer = writer
        self.rate = rate
        self._random = random.Random(seed)
        self._connect_s = connect_s
        self._on_listen = on_listen
        self._pool: EnginePool | None = None
        self._server: asyncio.base_events.Server | None = None
        self.requests = 0
        self.sampled = 0
        self.engine_unreachable = 0
        self.client_gone = 0
        self.engine_broke = 0

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests, "sampled": self.sampled, "engine_unreachable": self.engine_unreachable,
                               "client_disconnected": self.client_gone,
                               "engine_broke_off": self.engine_broke}
        if self.writer is not None:
            out.update(self.writer.snapshot())
        return out

    async def serve(self, host: str, port: int) -> None:
        """Serve until cancelled."""
        self._pool = EnginePool(self.engine, self._connect_s)
        try:
            self._server = await asyncio.start_server(self._connection, host, port, limit=_READ, reuse_address=True)
            bound = self._server.sockets[0].getsockname()
            if self._on_listen is not None:
                self._on_listen(bound[0], bound[1])
            async with self._server:
                await self._server.serve_forever()
        finally:
            await self._pool.aclose()

    # ---- one client connection ---------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await self._read_request(conn, reader, writer)
                if request is None:
                    return
                await self._exchange(conn, reader, writer, request, body)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body: list[bytes] = []
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._send_error(conn, writer, exc.error_status_hint, "bad request")
                return None, b""
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:
                    writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
                data = await reader.read(_READ)
                conn.receive_data(data)
                if not data and request is None:
                    return None, b""
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return request, b"".join(body)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None, b""

    async def _send_error(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        payload = json.dumps({"error": {"message": f"curator tap: {message}", "type": "tap_error", "code": status}}).encode()
        try:
            writer.write(conn.send(h11.Response(status_code=status, headers=[(b"content-type", b"application/json"),
                                                                          (b"content-length", str(len(payload)).encode())])) or b"")
            writer.write(conn.send(h11.Data(data=payload)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        except h11.LocalProtocolError:
            pass

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        request: h11.Request, body: bytes) -> None:
        target = bytes(request.target)
        path = target.split(b"?", 1)[0]
        if request.method == b"GET" and path == STATS_PATH:
            payload = json.dumps(self.stats()).encode()
            writer.write(conn.send(h11.Response(status_code=200, headers=[(b"content-type", b"application/json"),
                                                                        (b"content-length", str(len(payload)).encode())])) or b"")
            writer.write(conn.send(h11.Data(data=payload)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
            return
        self.requests += 1  # the tap's own stats requests are not the engine's traffic
        endpoint = ENDPOINTS.get(path.decode("latin-1")) if request.method == b"POST" else None
        exchange: Exchange | None = None
        if endpoint is not None and self.writer is not None and self.rate > 0 and (self.rate >= 1.0 or self._random.random() < self.rate):
            self.sampled += 1
            exchange = Exchange(endpoint=endpoint, request=body, time=time.time())
        headers = [(k, v) for k, v in request.headers if k.lower() not in _HOP]
        assert self._pool is not None
        # a client that goes away (EOF on its socket) while the engine works: seen at once, not at the next chunk
        watcher = asyncio.ensure_future(reader.read(_READ))
        try:
            try:
                response = await self._race(self._pool.send(request.method, target, headers, body), watcher)
            except EngineError as exc:
                self.engine_unreachable += 1
                await self._send_error(conn, writer, 502, f"engine unreachable: {exc}")
                return
            if response is None:  # the client left before the engine answered
                self._gone(exchange, 0)
                return
            try:
                out_headers = [(k, v) for k, v in response.headers if k not in _HOP or k == b"content-length"]
                writer.write(conn.send(h11.Response(status_code=response.status, headers=out_headers, reason=response.reason)) or b"")
                if exchange is not None:
                    exchange.status = response.status
                    exchange.streamed = response.header(b"content-type").startswith(b"text/event-stream")
                pump = asyncio.ensure_future(self._pump(conn, writer, response, exchange))
                try:
                    done = await self._race(pump, watcher)
                except ConnectionError:  # the client's socket failed under a write
                    done = None
                except EngineError:  # the engine broke off mid-answer: the client's connection closes too
                    self.engine_broke += 1
                    self._gone(exchange, response.status, client=False)
                    return
                if done is None:
                    self._gone(exchange, response.status)
                    return
            finally:
                response.close()
            self._submit(exchange)
        except asyncio.CancelledError:  # the tap is stopping mid-answer: what went by is recorded, incomplete
            self._gone(exchange, 0, client=False)
            raise
        finally:
            if watcher.done():
                if not watcher.cancelled() and watcher.exception() is None and watcher.result():
                    conn.receive_data(watcher.result())  # a pipelined next request: h11 keeps it for the next cycle
            else:
                watcher.cancel()
                try:  # the reader is free for the next request only once the cancel has landed
                    await watcher
                except (asyncio.CancelledError, ConnectionError):
                    pass

    async def _race(self, work: Any, watcher: asyncio.Future[bytes]) -> Any:
        """Run `work` (a coroutine or future); return its result, or None when the client hung up first."""
        task = asyncio.ensure_future(work)
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if watcher.exception() is None and watcher.result():
            return await task  # data from the client (pipelining), not a hang-up: keep going
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        return None

    async def _pump(self, conn: h11.Connection, writer: asyncio.StreamWriter, response: EngineResponse,
                    exchange: Exchange | None) -> bool:
        keep = exchange.chunks if exchange is not None else None
        async for chunk in response.chunks():
            if keep is not None:
                keep.append(chunk)
            writer.write(conn.send(h11.Data(data=chunk)) or b"")
            await writer.drain()
        # the whole answer went by: handed over now, so a tap stopped during the last write still records it
        self._submit(exchange)
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        return True

    def _submit(self, exchange: Exchange | None) -> None:
        """Hand `exchange` to the writer, once: it is the writer thread's from then on."""
        if exchange is not None and self.writer is not None and not exchange.submitted:
            exchange.submitted = True
            self.writer.submit(exchange)

    def _gone(self, exchange: Exchange | None, status: int, *, client: bool = True) -> None:
        self.client_gone += client
        if exchange is not None and not exchange.submitted:
            exchange.status = exchange.status or status
            exchange.delivered = False
            self._submit(exchange)
