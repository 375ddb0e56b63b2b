"""Model clients for the research agents: one interface over the Anthropic Messages API
(through the `anthropic` SDK) and any OpenAI-compatible chat-completions server (SGLang,
vLLM, ... through httpx).

An agent keeps its conversation in the API's own shape; the client both calls the model and
knows how to append the model's turn and the tool results to that conversation, so the agent
loop never branches on which API it talks to. Both clients retry rate limits (429),
overloads (529) and server errors (5xx) themselves, honouring `retry-after`, so that ten
agents sharing one key back off instead of failing.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from curator.errors import LLMError

DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
MODEL_ENV = "CURATOR_MODEL"
DEFAULT_MAX_OUTPUT_TOKENS = 4096
DEFAULT_TIMEOUT_S = 120.0

MISSING_KEY_HELP = (
    "no Anthropic API key: set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for a proxy or gateway), "
    "or point the agents at an OpenAI-compatible server with --llm openai --base-url URL "
    "(e.g. the SGLang server running your target); --planner rules needs no model at all"
)

# Status codes worth waiting for: rate limit, timeouts, overload and other server-side trouble.
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


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


@dataclass
class RetryPolicy:
    """How often and how long to wait on retryable failures."""

    max_attempts: int = 8
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Return the seconds to wait before attempt `attempt + 1` (retry-after wins when given)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        backoff = min(self.base_delay_s * (2 ** (attempt - 1)), self.max_delay_s)
        # Full jitter so that agents throttled together do not come back together.
        return backoff * (0.5 + random.random() / 2)


RetryHook = Callable[[int, float, str], None]


class LLMClient(Protocol):
    """The interface the agent loop uses, whatever API is behind it."""

    model: str
    retries: int

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


def parse_retry_after(headers: httpx.Headers | Any) -> float | None:
    """Return the wait a server asked for, in seconds, from retry-after-ms or retry-after; else None."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return float(value) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(parsed.timestamp() - time.time(), 0.0)


# -- Anthropic ---------------------------------------------------------------------------------


class _SharedMessages:
    """What the Anthropic and OpenAI clients have in common: message shapes and the retry count."""

    retries: int  # how many calls were retried so far
    retry: RetryPolicy

    def _classify(self, exc: BaseException) -> tuple[bool, float | None, str]:
        raise NotImplementedError

    async def _with_retries(self, call: Callable[[], Any], on_retry: RetryHook | None) -> Any:
        """Run `call` until it succeeds, retrying what `_classify` calls retryable; raise LLMError otherwise."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await call()
            except (LLMError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 - _classify decides; anything unknown is re-raised below
                retryable, retry_after, reason = self._classify(exc)
                if not retryable:
                    raise LLMError(reason) from exc
                if attempt >= self.retry.max_attempts:
                    raise LLMError(f"{reason} (gave up after {attempt} attempts)") from exc
                wait = self.retry.delay(attempt, retry_after)
                self.retries += 1
                if on_retry is not None:
                    on_retry(attempt, wait, reason)
                await asyncio.sleep(wait)

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
    ) -> None:
        import anthropic

        self._anthropic = anthropic
        self.model = model or os.environ.get(MODEL_ENV) or DEFAULT_ANTHROPIC_MODEL
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self.retries = 0
        kwargs: dict[str, Any] = {"max_retries": 0, "timeout": timeout_s}
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
                messages=messages,
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

    def _classify(self, exc: BaseException) -> tuple[bool, float | None, str]:
        a = self._anthropic
        if isinstance(exc, a.APIStatusError):
            status = exc.status_code
            detail = (getattr(exc, "api_message", None) or str(exc)).splitlines()[0][:300]
            if status in (401, 403):
                return False, None, f"Anthropic API refused the key (HTTP {status}): {detail}; check ANTHROPIC_API_KEY"
            if status == 404:
                return False, None, f"Anthropic API: model {self.model!r} or endpoint not found (HTTP 404): {detail}"
            if status in RETRYABLE_STATUS or status >= 500:
                return True, parse_retry_after(exc.response.headers), f"Anthropic API HTTP {status}: {detail}"
            return False, None, f"Anthropic API rejected the request (HTTP {status}): {detail}"
        if isinstance(exc, (a.APITimeoutError, a.APIConnectionError)):
            return True, None, f"cannot reach the Anthropic API at {self._client.base_url}: {exc}"
        return False, None, f"Anthropic client failed: {type(exc).__name__}: {exc}"

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


def chat_completions_url(base_url: str) -> str:
    """Return the chat-completions URL for a server base (`http://h:30000`, `.../v1` or the full URL)."""
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


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
    ) -> None:
        if not base_url:
            raise LLMError("--llm openai needs --base-url URL (e.g. http://localhost:30000/v1)")
        if not model:
            raise LLMError("--llm openai needs --model NAME (the name the server serves)")
        self.model = model
        self.url = chat_completions_url(base_url)
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self.retries = 0
        key = api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
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
            response = await self._http.post(self.url, json=body)
            response.raise_for_status()
            try:
                return response.json()
            except ValueError as exc:
                raise LLMError(f"{self.url} answered something that is not JSON: {response.text[:200]!r}") from exc

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

    def _classify(self, exc: BaseException) -> tuple[bool, float | None, str]:
        if isinstance(exc, httpx.HTTPStatusError):
            status = exc.response.status_code
            detail = exc.response.text[:300].replace("\n", " ")
            if status in (401, 403):
                return False, None, f"{self.url} refused the key (HTTP {status}): {detail}; set OPENAI_API_KEY if it needs one"
            if status == 404:
                return False, None, f"{self.url} not found (HTTP 404): is --base-url right and is {self.model!r} served? {detail}"
            if status in RETRYABLE_STATUS or status >= 500:
                return True, parse_retry_after(exc.response.headers), f"{self.url} HTTP {status}: {detail}"
            return False, None, f"{self.url} rejected the request (HTTP {status}): {detail}"
        if isinstance(exc, httpx.TransportError):
            return True, None, f"cannot reach {self.url}: {type(exc).__name__}: {exc}"
        return False, None, f"OpenAI-compatible client failed: {type(exc).__name__}: {exc}"

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
) -> LLMClient:
    """Return the client for `kind` ("anthropic" or "openai"); LLMError with a fix when misconfigured."""
    if kind == "anthropic":
        return AnthropicClient(model, api_key, base_url, max_output_tokens, retry)
    if kind == "openai":
        return OpenAIClient(model or os.environ.get(MODEL_ENV) or "", base_url or "", api_key, max_output_tokens, retry)
    raise LLMError(f"unknown --llm {kind!r}; use anthropic or openai")
