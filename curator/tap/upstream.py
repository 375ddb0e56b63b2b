"""The tap's side towards the engine: HTTP/1.1 over kept-alive asyncio connections, parsed by h11.

httpx did this job first; its layers (httpcore's pool, anyio's streams and cancel scopes) cost the
tap about as much CPU per request as everything else it does, and on a machine where the engine
itself needs the CPU that showed in the engine's throughput. A request here is one write of the
request's bytes and h11 events read back; the connection goes back to the pool only after a whole
answer. Closing a connection mid-answer is how a request is cancelled: SGLang and vLLM abort a
request whose client connection closes.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import h11

_READ = 65536


class EngineError(Exception):
    """The engine could not be reached, or broke off its answer (the message says which)."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.writer.close()

    async def receive(self, when: str) -> None:
        """Read what the engine sent next into the h11 state; EngineError naming `when` if it broke off."""
        try:
            data = await self.reader.read(_READ)
        except OSError as exc:
            raise EngineError(f"engine broke off {when}: {exc}") from None
        if not data:
            raise EngineError(f"engine closed the connection {when}")
        self.h11.receive_data(data)


class EngineResponse:
    """One answer being read: `status`, `reason`, `headers`, then `chunks()`; `close()` when done
    (a connection whose answer was read whole goes back to the pool, any other is closed)."""

    def __init__(self, pool: EnginePool, conn: _Conn, head: h11.Response) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status = head.status_code
        self.reason = bytes(head.reason)
        self.headers = [(bytes(k), bytes(v)) for k, v in head.headers]
        self._done = False

    def header(self, name: bytes) -> bytes:
        return next((v for k, v in self.headers if k == name), b"")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come (the transfer coding undone); EngineError when the engine breaks off."""
        conn = self._conn
        assert conn is not None
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                await conn.receive("mid-answer")
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = True
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise EngineError("engine closed the connection mid-answer")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
            self._pool.release(conn)
        else:
            conn.close()  # mid-answer: the engine sees the close and aborts the request


class EnginePool:
    """Connections to one engine (`http://` or `https://` host, port and path prefix), kept alive between requests."""

    def __init__(self, engine: str, connect_s: float = 10.0, keep: int = 512) -> None:
        parts = urlsplit(engine)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) address: {engine}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/").encode()
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        self.host_header = (parts.netloc.rsplit("@", 1)[-1] if not default_port else self.host).encode()
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.connect_s = connect_s
        self.keep = keep
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=_READ), self.connect_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise EngineError(f"ConnectError: {exc or type(exc).__name__}") from None
        return _Conn(reader, writer)

    def release(self, conn: _Conn) -> None:
        if len(self._idle) < self.keep and not conn.reader.at_eof():
            self._idle.append(conn)
        else:
            conn.close()

    async def send(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> EngineResponse:
        """Send one request and return its answer once the engine's status line and headers came.

        A kept-alive connection the engine closed while idle (uvicorn's keep-alive is 5 s) fails
        before any byte of an answer: the request is sent again once, on a new connection."""
        head = [(b"host", self.host_header), *headers, (b"content-length", str(len(body)).encode())]
        for attempt in range(2):
            kept = self._kept() if attempt == 0 else None  # the second try is always a new connection
            reused = kept is not None
            conn = kept or await self._connect()
            data = conn.h11.send(h11.Request(method=method, target=self.prefix + target, headers=head)) or b""
            if body:
                data += conn.h11.send(h11.Data(data=body)) or b""
            data += conn.h11.send(h11.EndOfMessage()) or b""
            try:
                try:
                    conn.writer.write(data)
                    await conn.writer.drain()
                except OSError as exc:
                    raise EngineError(f"WriteError: {exc}") from None
                return EngineResponse(self, conn, await self._head(conn))
            except EngineError:
                conn.close()
                if not (reused and attempt == 0):
                    raise
            except BaseException:  # cancelled (the client left): the engine must see the close
                conn.close()
                raise
        raise AssertionError("unreachable")

    def _kept(self) -> _Conn | None:
        """The most recently used idle connection not known to be closed by the engine."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    async def _head(self, conn: _Conn) -> h11.Response:
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise EngineError(f"engine answered no HTTP/1.1: {exc}") from None
            if event is h11.NEED_DATA:
                await conn.receive("before answering")
            elif isinstance(event, h11.Response):
                return event
            elif isinstance(event, h11.ConnectionClosed):
                raise EngineError("engine closed the connection before answering")
            # InformationalResponse (100 Continue): the final answer follows

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()
