"""Model clients for the research agents: one interface over the Anthropic Messages API
(through the `anthropic` SDK) and any OpenAI-compatible chat-completions server (SGLang,
vLLM, ... through httpx).

An agent keeps its conversation in the API's own shape; the client both calls the model and
knows how to append the model's turn and the tool results to that conversation, so the agent
loop never branches on which API it talks to. Both clients retry what curator/http.py calls
transient (rate limits, overloads, server errors), honouring `retry-after`, so that ten agents
sharing one key back off instead of failing.

Every call is bounded as generation's are: a deadline on the whole exchange (httpx's read timeout
is only the gap between two bytes, so a server dripping one byte every half second was never cut
off) and a cap on the answer's size, read as a stream. Every message names the server by its
URL without user:password.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from curator import http
from curator.errors import LLMError
from curator.http import Failure, RetryHook, RetryPolicy

DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
MODEL_ENV = "CURATOR_MODEL"
DEFAULT_MAX_OUTPUT_TOKENS = 4096
DEFAULT_TIMEOUT_S = 120.0  # the whole exchange of one call, first byte sent to last byte read
# An agent's turn is a few KB; the cap is generation's, far above any real answer.
DEFAULT_MAX_ANSWER_BYTES = http.DEFAULT_MAX_ANSWER_BYTES
# Ten agents share one key: wait longer than generation does (1 s doubling, up to a minute).
DEFAULT_RETRY = RetryPolicy(max_attempts=8, base_delay_s=1.0, max_delay_s=60.0)

MISSING_KEY_HELP = (
    "no Anthropic API key: set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for a proxy or gateway), "
    "or point the agents at an OpenAI-compatible server with --llm openai --base-url URL "
    "(e.g. the SGLang server running your target); --planner rules needs no model at all"
)


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; `error` says why its arguments could not be read."""

    id: str
    name: str
    arguments: dict[str, Any]
    error: str | None = None


@dataclass
class LLMTurn:
    """What the model answered in one call: its text, tool calls, token usage and stop reason.

    `stop_reason` uses the Anthropic names (end_turn, tool_use, max_tokens) for both APIs.
    `raw` is the assistant message in the API's own shape, appended to the conversation.
    """

    text: str
    tool_calls: list[ToolCall]
    input_tokens: int
    output_tokens: int
    stop_reason: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one tool call, to be sent back to the model."""

    call_id: str
    content: str
    is_error: bool = False


class LLMClient(Protocol):
    """The interface the agent loop uses, whatever API is behind it."""

    model: str
    retries: int
    endpoint: str  # the server's address, probed before the agents start

    async def complete(
        self,
        system: str,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        on_retry: RetryHook | None = None,
    ) -> LLMTurn:
        """Return the model's next turn for this conversation (`on_retry` hears about each wait)."""
        ...

    def user_message(self, text: str) -> list[dict[str, Any]]:
        """Return the messages that add a plain user message."""
        ...

    def assistant_messages(self, turn: LLMTurn) -> list[dict[str, Any]]:
        """Return the messages that add the model's turn to the conversation."""
        ...

    def tool_result_messages(self, outcomes: Sequence[ToolOutcome], note: str | None = None) -> list[dict[str, Any]]:
        """Return the messages that answer the model's tool calls (plus an optional note)."""
        ...

    async def aclose(self) -> None:
        """Release the HTTP connections."""
        ...


# -- Anthropic ---------------------------------------------------------------------------------


@functools.cache
def _capped_stream_class(base: type) -> type:
    """Return a subclass of `base` (httpx's AsyncByteStream, or that of the fork the SDK uses)
    that passes the bytes of a wrapped stream on and raises AnswerTooLarge past a cap."""

    class CappedStream(base):
        def __init__(self, inner: Any, max_bytes: int) -> None:
            self._inner = inner
            self._max_bytes = max_bytes

        async def __aiter__(self) -> AsyncIterator[bytes]:
            size = 0
            async for chunk in self._inner:
                size += len(chunk)
                if size > self._max_bytes:
                    raise http.AnswerTooLarge(self._max_bytes)
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    return CappedStream


def _cap_answers(max_bytes: int) -> Callable[[Any], Awaitable[None]]:
    """Return a response hook that bounds what the Anthropic SDK reads of an answer: a declared
    Content-Length over `max_bytes` is refused at once, any other body is cut off past it. The
    SDK reads the body inside its send and wraps the error; `_bound_failure` finds it."""

    async def hook(response: Any) -> None:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise http.AnswerTooLarge(max_bytes)
        # the SDK's httpx, or its fork: the stream base class of the module that made the response
        module = sys.modules[type(response).__module__.partition(".")[0]]
        response.stream = _capped_stream_class(module.AsyncByteStream)(response.stream, max_bytes)

    return hook



class _SharedMessages:
    """What the Anthropic and OpenAI clients have in common: message shapes and the retry count."""

    retries: int  # how many calls were retried so far
    retry: RetryPolicy
    timeout_s: float  # the deadline of one call's whole exchange
    endpoint: str  # shown in messages: never with user:password

    def _classify(self, exc: Exception) -> Failure:
        raise NotImplementedError

    def _bound_failure(self, exc: BaseException) -> Failure | None:
        """Return the Failure for a call cut off by its deadline (transient) or its size cap
        (permanent: the same request would fetch it again), wherever in the chain the SDK put it."""
        seen: BaseException | None = exc
        for _ in range(8):  # the SDK wraps a transport's error once or twice
            if seen is None:
                return None
            if isinstance(seen, http.DeadlineExceeded):
                return Failure(f"{self.endpoint} sent no whole answer within {self.timeout_s:g} s "
                               "(--request-timeout)", True)
            if isinstance(seen, http.AnswerTooLarge):
                return Failure(f"{self.endpoint}: {seen}; an agent's turn is a few KB, the rest was not read", False)
            seen = seen.__cause__ or seen.__context__
        return None

    async def _with_retries(self, call: Callable[[], Any], on_retry: RetryHook | None) -> Any:
        """Return `call()`'s result, retrying what `_classify` calls transient; raise LLMError otherwise."""
        attempts = 0

        async def once(attempt: int) -> Any:
            nonlocal attempts
            attempts = attempt
            try:
                return await asyncio.wait_for(call(), self.timeout_s)
            except asyncio.TimeoutError:
                raise http.DeadlineExceeded(f"no whole answer within {self.timeout_s:g} s") from None

        def hook(attempt: int, wait: float, reason: str) -> None:
            self.retries += 1
            if on_retry is not None:
                on_retry(attempt, wait, reason)

        def classify(exc: Exception) -> Failure | None:
            return None if isinstance(exc, LLMError) else self._bound_failure(exc) or self._classify(exc)

        try:
            return await http.retrying(once, self.retry, classify, hook)
        except asyncio.CancelledError:
            raise
        except LLMError as exc:  # built from a server's answer: it may echo what it was sent
            raise LLMError(http.redact(str(exc))) from exc.__cause__
        except Exception as exc:  # noqa: BLE001 - every failure becomes one LLMError with its reason
            failure = self._bound_failure(exc) or self._classify(exc)
            gave_up = f" (gave up after {attempts} attempts)" if failure.transient else ""
            raise LLMError(http.redact(failure.reason) + gave_up) from exc

    def user_message(self, text: str) -> list[dict[str, Any]]:
        """Return the messages that add a plain user message."""
        return [{"role": "user", "content": text}]

    def assistant_messages(self, turn: LLMTurn) -> list[dict[str, Any]]:
        """Return the messages that add the model's turn to the conversation."""
        return [turn.raw]


class AnthropicClient(_SharedMessages):
    """Anthropic Messages API with tool use, through `anthropic.AsyncAnthropic`.

    The SDK's own retries are off (max_retries=0) so that one policy, with the agent's display
    told about each wait, covers both APIs.
    """

    def __init__(
        self,
        model: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        retry: RetryPolicy | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        import anthropic

        self._anthropic = anthropic
        self.model = model or os.environ.get(MODEL_ENV) or DEFAULT_ANTHROPIC_MODEL
        self.max_output_tokens = max_output_tokens
        self.retry = retry or DEFAULT_RETRY
        self.retries = 0
        self.timeout_s = timeout_s
        # the SDK's own client (its defaults, its httpx), with the answer's size capped
        http_client = anthropic.DefaultAsyncHttpxClient(event_hooks={"response": [_cap_answers(max_answer_bytes)]})
        kwargs: dict[str, Any] = {"max_retries": 0, "timeout": timeout_s, "http_client": http_client}
        if api_key:
            kwargs["api_key"] = api_key
        if base_url:
            kwargs["base_url"] = base_url
        try:
            self._client = anthropic.AsyncAnthropic(**kwargs)
        except (anthropic.AnthropicError, ValueError, OSError) as exc:
            # e.g. a profile named by ANTHROPIC_PROFILE whose file is missing or unreadable
            detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise LLMError(f"{MISSING_KEY_HELP} ({detail})") from exc
        has_credentials = any(getattr(self._client, name, None) for name in ("api_key", "auth_token", "credentials"))
        if not has_credentials:
            raise LLMError(MISSING_KEY_HELP)
        self.endpoint = http.public_url(str(self._client.base_url))

    async def complete(
        self,
        system: str,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        on_retry: RetryHook | None = None,
    ) -> LLMTurn:
        """Return the model's next turn (retrying rate limits and overloads)."""

        async def call() -> Any:
            return await self._client.messages.create(
                model=self.model,
                max_tokens=self.max_output_tokens,
                system=system,
                # plain dicts in the API's shape: the SDK's TypedDicts describe them, the client sends them as they are
                messages=messages,  # type: ignore[arg-type]
                tools=[{"name": t["name"], "description": t["description"], "input_schema": t["input_schema"]} for t in tools],
            )

        message = await self._with_retries(call, on_retry)
        texts: list[str] = []
        calls: list[ToolCall] = []
        content: list[dict[str, Any]] = []
        for block in message.content:
            kind = getattr(block, "type", None)
            if kind == "text":
                texts.append(block.text)
                content.append({"type": "text", "text": block.text})
            elif kind == "tool_use":
                args = block.input if isinstance(block.input, dict) else {}
                error = None if isinstance(block.input, dict) else "tool input was not a JSON object"
                calls.append(ToolCall(block.id, block.name, dict(args), error))
                content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
            else:
                # Thinking and other blocks must go back unchanged for the API to accept the history.
                content.append(block.model_dump(exclude_none=True))
        usage = message.usage
        return LLMTurn(
            text="\n".join(texts),
            tool_calls=calls,
            input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
            stop_reason=str(message.stop_reason or "end_turn"),
            raw={"role": "assistant", "content": content},
        )

    def _classify(self, exc: Exception) -> Failure:
        a = self._anthropic
        if isinstance(exc, a.APIStatusError):
            status = exc.status_code
            detail = http.redact((getattr(exc, "api_message", None) or str(exc)).splitlines()[0])[:300]
            if status in (401, 403):
                return Failure(f"Anthropic API refused the key (HTTP {status}): {detail}; check ANTHROPIC_API_KEY", False)
            if status == 404:
                return Failure(f"Anthropic API: model {self.model!r} or endpoint not found (HTTP 404): {detail}", False)
            if http.is_transient(status):
                return Failure(f"Anthropic API HTTP {status}: {detail}", True, http.parse_retry_after(exc.response.headers))
            return Failure(f"Anthropic API rejected the request (HTTP {status}): {detail}", False)
        if isinstance(exc, (a.APITimeoutError, a.APIConnectionError)):
            return Failure(f"cannot reach the Anthropic API at {self.endpoint}: {exc}", True)
        return Failure(f"Anthropic client failed: {type(exc).__name__}: {exc}", False)

    def tool_result_messages(self, outcomes: Sequence[ToolOutcome], note: str | None = None) -> list[dict[str, Any]]:
        """Return one user message holding a tool_result block per call (and the note as text)."""
        blocks: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": o.call_id, "content": o.content, "is_error": o.is_error}
            for o in outcomes
        ]
        if note:
            blocks.append({"type": "text", "text": note})
        return [{"role": "user", "content": blocks}]

    async def aclose(self) -> None:
        """Release the HTTP connections."""
        await self._client.close()


# -- OpenAI-compatible -------------------------------------------------------------------------


def chat_completions_url(url: str) -> str:
    """Return the chat-completions URL of a server given as its root, `.../v1` or the full URL,
    without the user:password it may carry (that goes to the client as basic auth)."""
    return _endpoint(url)[0] + "/v1/chat/completions"


def _endpoint(url: str) -> tuple[str, httpx.BasicAuth | None]:
    try:
        return http.endpoint_root(url)  # its ValueError is redacted
    except ValueError as exc:
        raise LLMError(f"--base-url {exc}") from exc


class OpenAIClient(_SharedMessages):
    """Any OpenAI-compatible chat-completions server with tool calling (SGLang, vLLM, ...)."""

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        retry: RetryPolicy | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        if not base_url:
            raise LLMError("--llm openai needs --base-url URL (e.g. http://localhost:30000/v1)")
        if not model:
            raise LLMError("--llm openai needs --model NAME (the name the server serves)")
        self.model = model
        root, auth = _endpoint(base_url)  # user:password is sent as basic auth, never shown
        self.url = root + "/v1/chat/completions"
        self.endpoint = self.url
        self.max_output_tokens = max_output_tokens
        self.retry = retry or DEFAULT_RETRY
        self.retries = 0
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._http = httpx.AsyncClient(
            headers=http.bearer(api_key or os.environ.get("OPENAI_API_KEY")),
            timeout=http.timeout(timeout_s),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            auth=auth,
        )

    async def complete(
        self,
        system: str,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        on_retry: RetryHook | None = None,
    ) -> LLMTurn:
        """Return the model's next turn (retrying rate limits, overloads and server errors)."""
        body = {
            "model": self.model,
            "max_tokens": self.max_output_tokens,
            "messages": [{"role": "system", "content": system}, *messages],
            "tools": [
                {"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
                for t in tools
            ],
            "tool_choice": "auto",
        }

        async def call() -> dict[str, Any]:
            request = self._http.build_request("POST", self.url, json=body)
            streamed, content = await http.send_bounded(self._http, request, deadline_s=self.timeout_s,
                                                        max_bytes=self.max_answer_bytes)
            # the body read (and capped) above, where the status error's reader finds it
            response = httpx.Response(streamed.status_code, headers=streamed.headers, content=content, request=request)
            response.raise_for_status()
            try:
                return json.loads(content)
            except (ValueError, RecursionError) as exc:
                start = content[:200].decode("utf-8", "replace")
                raise LLMError(f"{self.url} answered something that is not JSON: {start!r}") from exc

        data = await self._with_retries(call, on_retry)
        return self._parse(data)

    def _parse(self, data: dict[str, Any]) -> LLMTurn:
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"{self.url} answered without choices[0].message: {json.dumps(data)[:200]}") from exc
        calls: list[ToolCall] = []
        for raw_call in message.get("tool_calls") or []:
            fn = raw_call.get("function") or {}
            raw_args = fn.get("arguments")
            args: dict[str, Any] = {}
            error = None
            if isinstance(raw_args, dict):
                args = raw_args
            elif raw_args:
                try:
                    parsed = json.loads(raw_args)
                except json.JSONDecodeError as exc:
                    error = f"arguments were not valid JSON ({exc.msg})"
                else:
                    if isinstance(parsed, dict):
                        args = parsed
                    else:
                        error = "arguments were not a JSON object"
            calls.append(ToolCall(str(raw_call.get("id") or f"call_{len(calls)}"), str(fn.get("name") or ""), args, error))
        finish = choice.get("finish_reason") or "stop"
        stop_reason = {"tool_calls": "tool_use", "function_call": "tool_use", "stop": "end_turn", "length": "max_tokens"}.get(
            finish, finish
        )
        if calls and stop_reason == "end_turn":
            stop_reason = "tool_use"  # some servers say "stop" even when they called tools
        usage = data.get("usage") or {}
        raw: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            raw["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in calls
            ]
        return LLMTurn(
            text=message.get("content") or "",
            tool_calls=calls,
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            stop_reason=stop_reason,
            raw=raw,
        )

    def _classify(self, exc: Exception) -> Failure:
        if isinstance(exc, httpx.HTTPStatusError):
            status = exc.response.status_code
            detail = http.error_text(exc.response)
            if status in (401, 403):
                return Failure(f"{self.url} refused the key (HTTP {status}): {detail}; set OPENAI_API_KEY if it needs one", False)
            if status == 404:
                return Failure(f"{self.url} not found (HTTP 404): is --base-url right and is {self.model!r} served? {detail}", False)
            if http.is_transient(status):
                return Failure(f"{self.url} HTTP {status}: {detail}", True, http.parse_retry_after(exc.response.headers))
            return Failure(f"{self.url} rejected the request (HTTP {status}): {detail}", False)
        if isinstance(exc, httpx.TransportError):
            return Failure(f"cannot reach {self.url}: {type(exc).__name__}: {exc}", True)
        return Failure(f"OpenAI-compatible client failed: {type(exc).__name__}: {exc}", False)

    def tool_result_messages(self, outcomes: Sequence[ToolOutcome], note: str | None = None) -> list[dict[str, Any]]:
        """Return one `tool` message per call (errors marked in the text), then the note as a user message."""
        messages: list[dict[str, Any]] = [
            {"role": "tool", "tool_call_id": o.call_id, "content": ("ERROR: " + o.content) if o.is_error else o.content}
            for o in outcomes
        ]
        if note:
            messages.append({"role": "user", "content": note})
        return messages

    async def aclose(self) -> None:
        """Release the HTTP connections."""
        await self._http.aclose()


def make_client(
    kind: str,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    retry: RetryPolicy | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> LLMClient:
    """Return the client for `kind` ("anthropic" or "openai"); LLMError with a fix when misconfigured.
    `timeout_s` bounds each call's whole exchange, `max_answer_bytes` its answer."""
    if kind == "anthropic":
        return AnthropicClient(model, api_key, base_url, max_output_tokens, retry, timeout_s, max_answer_bytes)
    if kind == "openai":
        model = model or os.environ.get(MODEL_ENV) or ""
        return OpenAIClient(model, base_url or "", api_key, max_output_tokens, retry, timeout_s, max_answer_bytes)
    raise LLMError(f"unknown --llm {kind!r}; use anthropic or openai")
