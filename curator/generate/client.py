"""OpenAI-compatible chat completions (SGLang, vLLM) over async httpx: one request, retries
with backoff across endpoints, and the start-up check.

Each endpoint slot owns a one-connection httpx client: the scheduler already bounds how many
requests are in flight, and a large shared httpx pool costs several times more CPU per request
than many small ones (measured: ~250 vs ~1,500 requests/s at 64 in flight).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from curator import http
from curator.engines.sampling import SamplingParams
from curator.errors import EndpointError
from curator.generate.scheduler import Scheduler
from curator.http import RetryPolicy
from training.records.gen_record import tool_call_problem

DEFAULT_TIMEOUT_S = 1800.0  # a whole 4K-token answer of a large model under load
JSON_HEADERS = {"Content-Type": "application/json"}


class TokenRequests(Protocol):
    """Token-exact requests (curator/generate/token_ids.py builds them; this module needs only their shape)."""

    def request(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None) -> Any: ...

    def completion(self, payload: Any, request: Any, endpoint: str, latency_s: float) -> Completion: ...


@dataclass
class Completion:
    """One answer of the target."""

    content: str
    reasoning_content: str | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    endpoint: str
    latency_s: float
    attempts: int = 1
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI shape: id, type, function {name, arguments}
    # Token mode (curator/generate/token_ids.py): the exact ids sent and produced; text mode: None.
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    mode: str = "text"
    mode_reason: str | None = None


class RequestError(EndpointError):
    """A chat request failed; `permanent` says whether trying again can help."""

    def __init__(self, message: str, *, status: int | None, permanent: bool, endpoint: str, attempts: int = 1):
        super().__init__(http.redact(message))  # the message goes to errors.jsonl: no key in it
        self.status = status
        self.permanent = permanent
        self.endpoint = endpoint
        self.attempts = attempts
        self.retry_after: float | None = None


def encode_body(body: Mapping[str, Any], endpoint: str) -> bytes:
    """Return a request body as JSON bytes, as httpx would send it; a permanent RequestError for one
    that cannot be (a lone surrogate in an earlier answer sent back as history, nesting too deep)."""
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        what = f"its text is not valid Unicode ({exc.reason} at position {exc.start}; an earlier answer held a lone surrogate?)"
    except (ValueError, TypeError, RecursionError) as exc:
        what = f"it is not JSON ({type(exc).__name__}: {str(exc)[:200]})"
    # The same conversation would fail the same way on every try: record it, go on with the others.
    raise RequestError(f"the request cannot be sent: {what}", status=None, permanent=True, endpoint=endpoint)


def split_reasoning(content: str | None, reasoning: str | None) -> tuple[str, str | None]:
    """Return (answer, reasoning): the server's parsed reasoning when it sent one, else the
    text of <think>...</think> taken out of the content (also when the chat template opened
    the tag itself, or the answer was cut off inside it)."""
    text = content or ""
    if reasoning:
        return text, reasoning
    stripped = text.lstrip()
    if "</think>" in text:
        head, answer = text.split("</think>", 1)
        head = head.lstrip()
        if head.startswith("<think>"):
            head = head[len("<think>"):]
        return answer.lstrip(), head.strip()
    if stripped.startswith("<think>"):
        return "", stripped[len("<think>"):].strip()
    return text, None


def _check_text_fields(message: Any, endpoint: str) -> None:
    """Raise a permanent RequestError when the message's content or reasoning is neither text nor null.

    A number or an object there is a well-formed answer of the wrong kind, not a torn one: asking
    again gets the same, so the row is recorded as failed rather than retried.
    """
    for key in ("content", "reasoning_content", "reasoning"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise RequestError(f"{endpoint} answered a {key} that is not text but {type(value).__name__}",
                               status=200, permanent=True, endpoint=endpoint)


def parse_completion(payload: Any, endpoint: str, latency_s: float) -> Completion:
    """Return the Completion in an OpenAI chat.completion body; raise a transient
    RequestError for a body that is not one (a proxy's error page, a truncated answer)."""
    try:
        choice = payload["choices"][0]
        message = choice["message"]
        usage = payload.get("usage") or {}
        _check_text_fields(message, endpoint)
        content, reasoning = split_reasoning(
            message.get("content"), message.get("reasoning_content") or message.get("reasoning")
        )
        calls: list[dict[str, Any]] = [
            {"id": str(c.get("id") or f"call_{i}"), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
            for i, c in enumerate(message.get("tool_calls") or [])
        ]
        for call in calls:
            fn = call["function"]
            if isinstance(fn["arguments"], dict):  # a server that sent the object itself
                fn["arguments"] = json.dumps(fn["arguments"], ensure_ascii=False)
            problem = tool_call_problem(call)
            if problem is not None:
                # Stored, the answer would be skipped as malformed by hidden-states, and the run would count
                # it complete: a row error instead, permanent (at temperature 0 it comes back the same) and
                # tried again by --retry-errors.
                raise RequestError(f"{endpoint} answered an unusable tool call: {problem}", status=200,
                                   permanent=True, endpoint=endpoint)
        if message.get("content") is None and not calls and not reasoning:
            # `content: null` with nothing else is no answer: stored, it would be an empty trained turn
            raise RequestError(f"{endpoint} answered no content (content: null) and no tool calls",
                               status=200, permanent=True, endpoint=endpoint)
        return Completion(
            content=content,
            reasoning_content=reasoning,
            finish_reason=str(choice.get("finish_reason") or "unknown"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            endpoint=endpoint,
            latency_s=latency_s,
            tool_calls=calls or None,
            mode_reason="chat completions return text only",
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise RequestError(
            f"malformed chat completion from {endpoint}: {type(exc).__name__}: {exc}",
            status=200, permanent=False, endpoint=endpoint,
        ) from exc


class EndpointClient:
    """One OpenAI-compatible server: `slots` one-connection httpx clients."""

    def __init__(self, url: str, slots: int, *, timeout_s: float = DEFAULT_TIMEOUT_S, api_key: str | None = None,
                 max_answer_bytes: int = http.DEFAULT_MAX_ANSWER_BYTES) -> None:
        # `url` is what records, generation.json, the catalog and the console show: user:password
        # is taken out of it and goes to the client as basic auth only.
        try:
            self.url, auth = http.endpoint_root(url)  # 'http://h:30000/v1/' -> 'http://h:30000'
        except ValueError as exc:
            raise EndpointError(f"endpoint {exc}") from exc
        self.timeout_s = timeout_s  # the whole exchange's deadline, not only the gap between bytes
        self.max_answer_bytes = max_answer_bytes
        headers = http.bearer(api_key)
        # Reads may take as long as a whole 4K-token answer; connects and writes must not hang.
        timeout = http.timeout(timeout_s, connect_s=30.0)
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        # One TLS context for all slots: building one reads the CA bundle (~50 ms each).
        tls = httpx.create_ssl_context()
        self._clients = [
            httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, limits=limits, verify=tls,
                              auth=auth)
            for _ in range(slots)
        ]
        # An absolute URL object skips httpx's per-request join and parse of base_url + path.
        self._chat_url = httpx.URL(self.url + "/v1/chat/completions")

    async def aclose(self) -> None:
        """Close every connection."""
        await asyncio.gather(*(c.aclose() for c in self._clients))

    async def chat(self, slot: int, body: Mapping[str, Any]) -> Completion:
        """Return the answer to one chat request sent on `slot`; raise RequestError."""
        payload, latency = await self.post(slot, self._chat_url, body)
        return parse_completion(payload, self.url, latency)

    async def post(self, slot: int, url: httpx.URL | str, body: Mapping[str, Any]) -> tuple[Any, float]:
        """Return (the JSON answer, seconds) of one POST on `slot`; raise RequestError. The whole
        exchange is bounded by the timeout and the answer by `max_answer_bytes`."""
        client = self._clients[slot]
        request = client.build_request("POST", url, content=encode_body(body, self.url), headers=JSON_HEADERS)
        start = time.perf_counter()
        try:
            response, content = await http.send_bounded(client, request, deadline_s=self.timeout_s,
                                                        max_bytes=self.max_answer_bytes)
        except httpx.TimeoutException as exc:
            raise RequestError(f"timed out ({type(exc).__name__}: {exc})", status=None, permanent=False,
                               endpoint=self.url) from exc
        except httpx.TransportError as exc:
            raise RequestError(f"connection failed ({type(exc).__name__}: {exc})", status=None,
                               permanent=False, endpoint=self.url) from exc
        except http.AnswerTooLarge as exc:
            # Nothing a draft trains on is that large; the same request would only fetch it again.
            raise RequestError(f"{exc} (--max-answer-bytes); not stored", status=200, permanent=True,
                               endpoint=self.url) from exc
        latency = time.perf_counter() - start
        if response.status_code != 200:
            status = response.status_code
            err = RequestError(
                f"HTTP {status}: {http.error_text(content, 500)}", status=status,
                permanent=not http.is_transient(status), endpoint=self.url,
            )
            err.retry_after = http.parse_retry_after(response.headers)
            raise err
        try:
            payload = json.loads(content)
        except (ValueError, RecursionError) as exc:
            why = "nested too deep" if isinstance(exc, RecursionError) else "not JSON"
            raise RequestError(f"answer from {self.url} is {why}", status=200, permanent=False,
                               endpoint=self.url) from None
        return payload, latency

    async def check(self, model: str, extra_body: Mapping[str, Any], retry: RetryPolicy) -> None:
        """Raise EndpointError (one line) unless the server lists `model` and answers a
        one-token request for it."""
        client = self._clients[0]
        try:
            response = await client.get("/v1/models", timeout=30.0)
        except httpx.HTTPError as exc:
            raise EndpointError(f"endpoint {self.url} is not reachable ({type(exc).__name__}: {exc})") from exc
        if response.status_code != 200:
            raise EndpointError(f"endpoint {self.url} answered HTTP {response.status_code} to GET /v1/models: "
                                f"{http.error_text(response, 500)}")
        try:
            served = [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise EndpointError(f"endpoint {self.url} is not OpenAI-compatible (GET /v1/models gave no model list)") from exc
        if model not in served:
            raise EndpointError(f"endpoint {self.url} serves {', '.join(served) or 'no model'}, not {model!r}")
        body = {**extra_body, "model": model, "messages": [{"role": "user", "content": "Say OK."}],
                "max_tokens": 1, "temperature": 0.0, "stream": False}
        # A busy server may shed load (429/503) for a moment; only a lasting failure is fatal.
        policy = dataclasses.replace(retry, max_attempts=min(3, retry.max_attempts))
        try:
            await http.retrying(lambda attempt: self.chat(0, body), policy, _failure)
        except RequestError as exc:
            raise EndpointError(f"endpoint {self.url} failed a one-token request for {model!r}: {exc}") from exc


class OpenAIBackend:
    """Chat completions spread over endpoints by the scheduler, with retries."""

    def __init__(
        self,
        urls: Sequence[str],
        model: str,
        params: SamplingParams,
        *,
        concurrency: int = 64,
        retry: RetryPolicy = RetryPolicy(),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_answer_bytes: int = http.DEFAULT_MAX_ANSWER_BYTES,
        tokens: TokenRequests | None = None,
    ) -> None:
        if not urls:
            raise EndpointError("no endpoint given (pass --endpoint http://host:port)")
        api_key = os.environ.get("OPENAI_API_KEY") or None
        self.model = model
        self.params = params
        self.retry = retry
        self.tokens = tokens  # token-exact requests (token_ids.py) instead of chat completions
        self.endpoints: dict[str, EndpointClient] = {}
        for url in urls:
            client = EndpointClient(url, concurrency, timeout_s=timeout_s, api_key=api_key,
                                    max_answer_bytes=max_answer_bytes)
            if client.url in self.endpoints:
                raise EndpointError(f"endpoint {client.url} was given twice")
            self.endpoints[client.url] = client
        self.scheduler = Scheduler({name: concurrency for name in self.endpoints})
        self.retries = 0
        self.errors_by_endpoint: dict[str, int] = {name: 0 for name in self.endpoints}

    @property
    def workers(self) -> int:
        """Return how many conversations should run at once to fill every slot."""
        return self.scheduler.capacity

    def in_flight(self) -> dict[str, int]:
        """Return the requests in flight per endpoint."""
        return self.scheduler.in_flight()

    def requests_by_endpoint(self) -> dict[str, int]:
        """Return how many requests were sent to each endpoint (retries included)."""
        return self.scheduler.dispatched()

    async def start(self) -> None:
        """Run the start-up check on every endpoint at once; raise the first failure."""
        results = await asyncio.gather(
            *(ep.check(self.model, self.params.extra_body, self.retry) for ep in self.endpoints.values()),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def aclose(self) -> None:
        """Close every connection."""
        await asyncio.gather(*(ep.aclose() for ep in self.endpoints.values()))

    def body(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Return the request body for `messages` and the tools offered (role, content and the tool
        fields are sent: earlier reasoning stays out of the history, as the targets' own chat
        templates do)."""
        body: dict[str, Any] = dict(self.params.extra_body)
        keep = ("role", "content", "tool_calls", "tool_call_id", "name")
        if tools:
            body["tools"] = tools
        body.update(
            model=self.model,
            messages=[{k: m[k] for k in keep if m.get(k) is not None} | {"content": m.get("content") or ""}
                      for m in messages],
            temperature=self.params.temperature,
            max_tokens=self.params.max_tokens,
            stream=False,
        )
        if self.params.top_p is not None:
            body["top_p"] = self.params.top_p
        return body

    async def complete(self, messages: Sequence[Mapping[str, Any]], prefer: str | None = None,
                       tools: list[dict[str, Any]] | None = None) -> Completion:
        """Return the target's answer to `messages`; retry transient failures with backoff on
        the least-loaded endpoint (another one than the one that failed, where possible); raise
        RequestError when the failure is permanent or the attempts are spent."""
        request = self.tokens.request(messages, tools) if self.tokens is not None else None
        body = self.body(messages, tools) if request is None else request.body
        avoid: str | None = None

        async def once(attempt: int) -> Completion:
            nonlocal avoid
            lease = await self.scheduler.acquire(prefer=None if avoid else prefer, avoid=avoid)
            try:
                endpoint = self.endpoints[lease.endpoint]
                if request is None:
                    completion = await endpoint.chat(lease.slot, body)
                else:
                    payload, latency = await endpoint.post(lease.slot, endpoint.url + request.path, body)
                    completion = self.tokens.completion(payload, request, endpoint.url, latency)  # type: ignore[union-attr]
            except RequestError as exc:
                exc.attempts = attempt
                self.errors_by_endpoint[lease.endpoint] += 1
                avoid = lease.endpoint
                raise
            finally:
                self.scheduler.release(lease)
            completion.attempts = attempt
            return completion

        def count_retry(attempt: int, wait: float, reason: str) -> None:
            self.retries += 1

        return await http.retrying(once, self.retry, _failure, count_retry)


def _failure(exc: Exception) -> http.Failure | None:
    """Return how a failed chat request is handled (None: not a request failure, re-raise it)."""
    if isinstance(exc, RequestError):
        return http.Failure(str(exc), not exc.permanent, exc.retry_after)
    return None
