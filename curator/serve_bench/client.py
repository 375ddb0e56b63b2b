"""One timed, streamed request to a serving engine: SGLang's native `/generate`, or vLLM's
OpenAI-compatible `/v1/chat/completions`.

Streaming gives the time to the first token, so time per output token excludes the prefill.
Greedy decoding (temperature 0) by default: the engine's acceptance is then the draft's alone. A
temperature makes the engine verify by sampling, which accepts a draft token only as often as the
target would sample it: the acceptance users get when they serve at that temperature
(`curator eval --temperature` measures the same in process).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from curator import http
from curator.errors import EndpointError
from curator.engines import ENGINES


@dataclass
class RequestResult:
    """One request as the client saw it, with the engine's verify count when it gives one."""

    category: str
    output_tokens: int
    latency_s: float
    ttft_s: float
    verify_ct: int | None = None  # SGLang: target verify forwards of this request

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.latency_s if self.latency_s > 0 else 0.0

    @property
    def time_per_output_token_s(self) -> float | None:
        """Return the decode time per token after the first (None for a one-token answer)."""
        if self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Endpoint:
    """A running server: its engine, base URL and (vLLM) the served model name.

    `url` is the public root: user:password in the given URL moves into `auth` (sent as basic auth,
    never shown in an error, a table or the JSON report)."""

    engine: str
    url: str
    model: str = ""
    auth: httpx.BasicAuth | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise EndpointError(f"engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        try:
            root, auth = http.endpoint_root(self.url)  # 'http://h:8000/v1/' and 'http://h:8000' alike
        except ValueError as exc:
            raise EndpointError(str(exc)) from None
        object.__setattr__(self, "url", root)
        if auth is not None:
            object.__setattr__(self, "auth", auth)

    def with_model(self, model: str) -> Endpoint:
        """Return this endpoint serving `model` (the credentials kept)."""
        return Endpoint(self.engine, self.url, model, self.auth)


async def _lines(response: httpx.Response, max_bytes: int) -> AsyncIterator[str]:
    """Yield a streamed answer's lines, reading at most `max_bytes` in all (AnswerTooLarge past it):
    one endless line never sits in memory whole."""
    buf, size = b"", 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise http.AnswerTooLarge(max_bytes)
        buf += chunk
        *whole, buf = buf.split(b"\n")
        for line in whole:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if buf:
        yield buf.decode("utf-8", "replace")


async def _sse(response: httpx.Response, max_bytes: int = http.DEFAULT_MAX_ANSWER_BYTES) -> AsyncIterator[dict[str, Any]]:
    """Yield the JSON events of a server-sent-event stream until `data: [DONE]`."""
    async for line in _lines(response, max_bytes):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except json.JSONDecodeError:
            raise EndpointError(f"the server streamed a line that is not JSON: {data[:80]!r}") from None


async def timed_request(client: httpx.AsyncClient, endpoint: Endpoint, category: str, prompt: Any,
                        max_tokens: int, temperature: float = 0.0, *, deadline_s: float | None = None,
                        max_bytes: int = http.DEFAULT_MAX_ANSWER_BYTES) -> RequestResult:
    """Return the timing and counts of one request (prompt: token ids for SGLang, messages for vLLM).

    `deadline_s` bounds the whole request, from sending to the last byte (a server that drips one
    byte at a time is cut off); `max_bytes` bounds the answer. Default deadline: the client's read timeout.
    """
    engine = ENGINES[endpoint.engine]
    path, body = engine.bench_request(prompt, endpoint.model, max_tokens, temperature)
    deadline = deadline_s if deadline_s is not None else client.timeout.read
    start = time.perf_counter()
    first: float | None = None
    last: dict[str, Any] = {}
    usage: dict[str, Any] = {}

    async def exchange() -> None:
        nonlocal first, last, usage
        async with client.stream("POST", endpoint.url + path, json=body, auth=endpoint.auth) as response:
            if response.status_code != 200:
                content = await http.read_capped(response, 64 * 1024)
                raise EndpointError(f"{endpoint.url}{path} answered {response.status_code}: {http.error_text(content)}")
            async for event in _sse(response, max_bytes):
                if first is None and engine.streamed_output(event):
                    first = time.perf_counter()
                last = event
                usage = event.get("usage") or usage

    try:
        await asyncio.wait_for(exchange(), deadline) if deadline is not None else await exchange()
    except asyncio.TimeoutError:
        raise EndpointError(f"{endpoint.url}{path}: no whole answer within {deadline:g} s (--timeout)") from None
    except http.AnswerTooLarge as exc:
        raise EndpointError(f"{endpoint.url}{path}: {exc}; the rest was not read") from None
    except httpx.HTTPError as exc:
        raise EndpointError(f"{endpoint.url}{path} failed: {http.redact(repr(exc))}") from None
    latency = time.perf_counter() - start
    ttft = (first or time.perf_counter()) - start
    tokens, verify = engine.bench_counts(last, usage, endpoint.url + path)
    return RequestResult(category, tokens, latency, ttft, verify)


async def _get(client: httpx.AsyncClient, url: str, auth: httpx.BasicAuth | None,
               max_bytes: int = http.DEFAULT_MAX_ANSWER_BYTES) -> tuple[httpx.Response, bytes]:
    request = client.build_request("GET", url)
    if auth is not None:
        request = next(auth.auth_flow(request))
    response, content = await http.send_bounded(client, request, deadline_s=client.timeout.read or 600.0,
                                                max_bytes=max_bytes)
    response.raise_for_status()
    return response, content


async def served_model(client: httpx.AsyncClient, url: str, auth: httpx.BasicAuth | None = None) -> str:
    """Return the first model id a vLLM server lists at /v1/models."""
    url = http.public_url(url)
    try:
        _, content = await _get(client, url + "/v1/models", auth)
        return str(json.loads(content)["data"][0]["id"])
    except (httpx.HTTPError, http.AnswerTooLarge, KeyError, IndexError, TypeError, ValueError, RecursionError) as exc:
        raise EndpointError(f"{url}/v1/models did not name a model ({http.redact(repr(exc))}); "
                            "pass --served-model") from None


async def metrics_page(client: httpx.AsyncClient, url: str, auth: httpx.BasicAuth | None = None) -> str:
    """Return the text of a server's Prometheus `/metrics` page."""
    url = http.public_url(url)
    try:
        _, content = await _get(client, url + "/metrics", auth)
    except (httpx.HTTPError, http.AnswerTooLarge) as exc:
        raise EndpointError(f"{url}/metrics is unreachable ({http.redact(repr(exc))}); vLLM serves it unless "
                            "metrics are disabled") from None
    return content.decode("utf-8", "replace")
