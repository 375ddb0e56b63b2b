"""Model clients for the research agents: one interface over the Anthropic Messages API
(through the `anthropic` SDK) and any OpenAI-compatible chat-completions server (SGLang,
vLLM, ... through httpx).

An agent keeps its conversation in the API's own shape; the client both calls the model and
knows how to append the model's turn and the tool results to that conversation, so the agent
loop never branches on which API it talks to. Both clients retry what curator/http.py calls
transient (rate limits, overloads, server errors), honouring `retry-after`, so that ten agents
sharing one key back off instead of failing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from curator import http
from curator.errors import LLMError
from curator.http import Failure, RetryHook, RetryPolicy

DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
MODEL_ENV = "CURATOR_MODEL"
DEFAULT_MAX_OUTPUT_TOKENS = 4096
DEFAULT_TIMEOUT_S = 120.0
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


class _SharedMessages:
    """What the Anthropic and OpenAI clients have in common: message shapes and the retry count."""

    retries: int  # how many calls were retried so far
    retry: RetryPolicy

    def _classify(self, exc: Exception) -> Failure:
        raise NotImplementedError

    async def _with_retries(self, call: Callable[[], Any], on_retry: RetryHook | None) -> Any:
        """Return `call()`'s result, retrying what `_classify` calls transient; raise LLMError otherwise."""
        attempts = 0

        async def once(attempt: int) -> Any:
            nonlocal attempts
            attempts = attempt
            return await call()

        def hook(attempt: int, wait: float, reason: str) -> None:
            self.retries += 1
            if on_retry is not None:
                on_retry(attempt, wait, reason)

        def classify(exc: Exception) -> Failure | None:
            return None if isinstance(exc, LLMError) else self._classify(exc)

        try:
            return await http.retrying(once, self.retry, classify, hook)
        except (LLMError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes one LLMError with its reason
            failure = self._classify(exc)
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
    ) -> None:
        import anthropic

        self._anthropic = anthropic
        self.model = model or os.environ.get(MODEL_ENV) or DEFAULT_ANTHROPIC_MODEL
        self.max_output_tokens = max_output_tokens
        self.retry = retry or DEFAULT_RETRY
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
        self.endpoint = str(self._client.base_url)

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
            return Failure(f"cannot reach the Anthropic API at {self._client.base_url}: {exc}", True)
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
    """Return the chat-completions URL of a server given as its root, `.../v1` or the full URL."""
    try:
        return http.base_url(url) + "/v1/chat/completions"
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
    ) -> None:
        if not base_url:
            raise LLMError("--llm openai needs --base-url URL (e.g. http://localhost:30000/v1)")
        if not model:
            raise LLMError("--llm openai needs --model NAME (the name the server serves)")
        self.model = model
        self.url = chat_completions_url(base_url)
        self.endpoint = self.url
        self.max_output_tokens = max_output_tokens
        self.retry = retry or DEFAULT_RETRY
        self.retries = 0
        self._http = httpx.AsyncClient(
            headers=http.bearer(api_key or os.environ.get("OPENAI_API_KEY")),
            timeout=http.timeout(timeout_s),
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
) -> LLMClient:
    """Return the client for `kind` ("anthropic" or "openai"); LLMError with a fix when misconfigured."""
    if kind == "anthropic":
        return AnthropicClient(model, api_key, base_url, max_output_tokens, retry, timeout_s)
    if kind == "openai":
        model = model or os.environ.get(MODEL_ENV) or ""
        return OpenAIClient(model, base_url or "", api_key, max_output_tokens, retry, timeout_s)
    raise LLMError(f"unknown --llm {kind!r}; use anthropic or openai")
