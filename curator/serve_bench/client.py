"""One timed, streamed request to a serving engine: SGLang's native `/generate`, or vLLM's
OpenAI-compatible `/v1/chat/completions`.

Streaming gives the time to the first token, so time per output token excludes the prefill.
Greedy decoding (temperature 0) by default: the engine's acceptance is then the draft's alone. A
temperature makes the engine verify by sampling, which accepts a draft token only as often as the
target would sample it: the acceptance users get when they serve at that temperature
(`curator eval --temperature` measures the same in process).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
    """A running server: its engine, base URL and (vLLM) the served model name."""

    engine: str
    url: str
    model: str = ""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise EndpointError(f"engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        try:
            object.__setattr__(self, "url", http.base_url(self.url))  # 'http://h:8000/v1/' and 'http://h:8000' alike
        except ValueError as exc:
            raise EndpointError(str(exc)) from None


async def _sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Yield the JSON events of a server-sent-event stream until `data: [DONE]`."""
    async for line in response.aiter_lines():
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
                        max_tokens: int, temperature: float = 0.0) -> RequestResult:
    """Return the timing and counts of one request (prompt: token ids for SGLang, messages for vLLM)."""
    engine = ENGINES[endpoint.engine]
    path, body = engine.bench_request(prompt, endpoint.model, max_tokens, temperature)
    start = time.perf_counter()
    first: float | None = None
    last: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    try:
        async with client.stream("POST", endpoint.url + path, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise EndpointError(f"{endpoint.url}{path} answered {response.status_code}: {http.error_text(response)}")
            async for event in _sse(response):
                if first is None and engine.streamed_output(event):
                    first = time.perf_counter()
                last = event
                usage = event.get("usage") or usage
    except httpx.HTTPError as exc:
        raise EndpointError(f"{endpoint.url}{path} failed: {exc!r}") from None
    latency = time.perf_counter() - start
    ttft = (first or time.perf_counter()) - start
    tokens, verify = engine.bench_counts(last, usage, endpoint.url + path)
    return RequestResult(category, tokens, latency, ttft, verify)


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    """Return the first model id a vLLM server lists at /v1/models."""
    try:
        response = await client.get(url + "/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise EndpointError(f"{url}/v1/models did not name a model ({exc!r}); pass --served-model") from None


async def metrics_page(client: httpx.AsyncClient, url: str) -> str:
    """Return the text of a server's Prometheus `/metrics` page."""
    try:
        response = await client.get(url + "/metrics")
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise EndpointError(f"{url}/metrics is unreachable ({exc!r}); vLLM serves it unless metrics are disabled") from None
    return response.text
