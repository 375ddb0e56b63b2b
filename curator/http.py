"""The data side's one HTTP layer: which failures are worth another try, how long to wait,
what a server's Retry-After means, what a base URL is, the default timeouts, where a credential
may go, and how an error body is cleaned of secrets before anyone stores it.

Every client of the data side uses it: the agents' model clients (`curator/llm.py`, the
Anthropic SDK and OpenAI-compatible servers), generation (`curator/generate/client.py`), the
vLLM hidden-state client (`curator/engines/vllm_capture.py`) and the Hub client (`curator/hub.py`).
docs/http.md states the contract.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

T = TypeVar("T")

# Transient statuses: the server's state, not the request, made it fail, so the same request
# can succeed later.
# - 408 Request Timeout, 425 Too Early (a TLS 0-RTT replay refused: the RFC says send it again),
#   429 Too Many Requests: all three mean "again, later".
# - 409 Conflict: the Anthropic and OpenAI SDKs retry it (their APIs answer 409 on a lock or
#   concurrent-modification race); every request this layer sends is idempotent, so a retry is safe.
# - 5xx: overloads (503, 529 Anthropic "overloaded"), crashed or restarting workers behind a
#   proxy (500, 502, 504, Cloudflare's 520-524), except those that describe the server itself
#   and will answer the same every time: 501 Not Implemented (the dataset viewer's answer for a
#   dataset it cannot serve), 505 HTTP Version Not Supported, 506, 508 (a configuration loop),
#   510 Not Extended, 511 Network Authentication Required (a captive portal wants a login).
# Everything else (400, 401, 403, 404, 413, 422, ...) fails the same way on every try.
PERMANENT_5XX = frozenset({501, 505, 506, 508, 510, 511})
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429} | set(range(500, 600)) - PERMANENT_5XX)

# Connects and writes must not hang; reads get what the caller's work needs (a long answer).
CONNECT_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 60.0


def is_transient(status: int) -> bool:
    """Return whether an HTTP status is worth retrying (see TRANSIENT_STATUSES)."""
    return status in TRANSIENT_STATUSES


def timeout(read_s: float, *, connect_s: float = CONNECT_TIMEOUT_S, write_s: float = WRITE_TIMEOUT_S) -> httpx.Timeout:
    """Return the httpx timeouts for a client whose answers may take `read_s` seconds."""
    # No pool timeout: callers bound the requests in flight themselves (slots, semaphores).
    return httpx.Timeout(read_s, connect=min(connect_s, read_s), write=write_s, pool=None)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient failures are retried (the defaults: 8 tries,
    0.5 s doubling, at most 30 s apart)."""

    max_attempts: int = 8
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Return the pause before attempt `attempt + 1`: the server's Retry-After when it sent
        one, else exponential backoff with jitter; never more than max_delay_s."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        backoff = min(self.base_delay_s * 2 ** (attempt - 1), self.max_delay_s)
        # Jitter, so that requests throttled together do not all come back together.
        return backoff * random.uniform(0.5, 1.0)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Return the wait a server asked for, in seconds (retry-after-ms, or Retry-After as seconds
    or an HTTP-date); None when it asked for none or wrote something unreadable."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(float(value) / 1000.0, 0.0)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(when.timestamp() - time.time(), 0.0)


@dataclass(frozen=True)
class Failure:
    """How one failed attempt should be handled: `reason` in the user's words."""

    reason: str
    transient: bool
    retry_after: float | None = None


RetryHook = Callable[[int, float, str], None]


async def retrying(
    attempt_once: Callable[[int], Awaitable[T]],
    policy: RetryPolicy,
    classify: Callable[[Exception], Failure | None],
    on_retry: RetryHook | None = None,
) -> T:
    """Return the first result of `attempt_once(attempt)` (attempt = 1, 2, ...), waiting as
    `policy` says after each failure that `classify` calls transient. A permanent failure, one
    `classify` does not know (None), or the last attempt's failure is raised as it was."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await attempt_once(attempt)
        except Exception as exc:  # noqa: BLE001 - classify decides; what it does not know is re-raised
            failure = classify(exc)
            if failure is None or not failure.transient or attempt >= policy.max_attempts:
                raise
            wait = policy.delay(attempt, failure.retry_after)
            if on_retry is not None:
                on_retry(attempt, wait, redact(failure.reason))  # shown and logged: no key in it
        await asyncio.sleep(wait)


# -- bounded answers --------------------------------------------------------------------------

# An answer of a 4K-token completion is tens of KB; 16 MiB leaves room for long contexts echoed
# back with logprobs, and keeps one bad server from filling memory and shards.
DEFAULT_MAX_ANSWER_BYTES = 16 * 2**20


class DeadlineExceeded(httpx.TimeoutException):
    """A request's whole exchange, from sending to the last byte of the answer, took longer than
    its deadline (httpx's own read timeout is only the gap between two bytes)."""


class AnswerTooLarge(Exception):
    """An answer passed the byte cap; the rest of it was not read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is larger than {limit:,} bytes")
        self.limit = limit


async def read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    """Return the body of a streamed response, reading no more than `max_bytes` (AnswerTooLarge past
    it: a declared Content-Length over the cap is refused before any byte is read)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise AnswerTooLarge(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLarge(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


async def send_bounded(
    client: httpx.AsyncClient, request: httpx.Request, *, deadline_s: float, max_bytes: int
) -> tuple[httpx.Response, bytes]:
    """Return (the response, its body) of `request`, the whole exchange bounded by `deadline_s`
    seconds (DeadlineExceeded) and the body by `max_bytes` (AnswerTooLarge); memory stays bounded
    because the body is read as a stream."""

    async def exchange() -> tuple[httpx.Response, bytes]:
        response = await client.send(request, stream=True)
        try:
            return response, await read_capped(response, max_bytes)
        finally:
            await response.aclose()

    try:
        return await asyncio.wait_for(exchange(), deadline_s)
    except asyncio.TimeoutError as exc:
        raise DeadlineExceeded(f"no whole answer within {deadline_s:g} s", request=request) from exc


def httpx_failure(exc: Exception, what: str) -> Failure | None:
    """Return the Failure for an httpx error met while doing `what`: a status by
    TRANSIENT_STATUSES (with the server's Retry-After and redacted body), a timeout or broken
    connection as transient; None for anything that is not an httpx error."""
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return Failure(f"{what}: HTTP {status}: {error_text(exc.response)}", is_transient(status),
                       parse_retry_after(exc.response.headers))
    if isinstance(exc, httpx.TransportError):
        return Failure(redact(f"{what}: {type(exc).__name__}: {exc}"), True)
    return None


# How long a one-request reachability probe waits before a command says a server cannot be reached
# (huggingface_hub's own retries would take minutes to say the same of the Hub).
PROBE_TIMEOUT_S = 3.0


def unreachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Return why `url` cannot be reached (the transport error's name), or None when it answers at all:
    any HTTP status, even an error, shows that the network reaches the server."""
    try:
        httpx.head(url, timeout=timeout_s, follow_redirects=False)
    except httpx.TransportError as exc:
        return type(exc).__name__
    return None


def base_url(url: str) -> str:
    """Return a server's root URL: whitespace, trailing slashes and a trailing OpenAI-style
    '/v1' (or '/v1/chat/completions', '/v1/completions') removed, so 'http://h:30000/v1/' and
    'http://h:30000' both give 'http://h:30000'. ValueError for anything but an http(s) URL."""
    root = url.strip().rstrip("/")
    for suffix in ("/v1/chat/completions", "/v1/completions", "/v1"):
        if root.endswith(suffix):
            root = root[: -len(suffix)].rstrip("/")
            break
    parts = urlsplit(root)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL (expected e.g. http://host:30000)")
    return root


# -- credentials ---------------------------------------------------------------------------


def origin(url: str | httpx.URL) -> tuple[str, str, int]:
    """Return (scheme, host, port) of a URL, the port filled in from the scheme: where a
    credential belongs."""
    parts = urlsplit(str(url))
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme, 0)


def bearer(token: str | None) -> dict[str, str]:
    """Return the Authorization header for a bearer token (none without a token); the token is
    registered, so that redact() hides it wherever it is echoed back."""
    register_secret(token)
    return {"Authorization": f"Bearer {token}"} if token else {}


def split_credentials(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """Return (`url` without its user:password, the basic auth it carried or None). The URL is what
    gets recorded and shown; the auth goes to the client only, and its password is registered as a
    secret for redact()."""
    parts = urlsplit(url.strip())
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    register_secret(unquote(password))
    register_secret(password)
    return urlunsplit(parts._replace(netloc=host)), httpx.BasicAuth(unquote(user), unquote(password))


def endpoint_root(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """Return (the server's root URL as base_url() gives it, without user:password; the basic auth
    the URL carried, or None). ValueError, its message redacted, for anything but an http(s) URL."""
    try:
        public, auth = split_credentials(url)  # user:password is sent, never shown
        return base_url(public), auth
    except ValueError as exc:
        raise ValueError(redact(str(exc))) from None


def endpoint_roots(urls: Iterable[str]) -> tuple[list[str], dict[str, httpx.Auth]]:
    """Return the roots of several endpoint URLs and the basic auth each one carried, by root
    (ValueError, redacted, for the first that is not an http(s) URL)."""
    roots: list[str] = []
    auth: dict[str, httpx.Auth] = {}
    for given in urls:
        root, credentials = endpoint_root(given)  # user:password is sent, never shown
        roots.append(root)
        if credentials is not None:
            auth[root] = credentials
    return roots, auth


# scheme://user:password@ (or scheme://token@): the part of a URL that must never be recorded
# userinfo may not hold an unescaped ? or #, but a malformed URL's password must not leak through one:
# over-stripping an odd query (scheme://host?x=a@b) is the safer error for a redaction
# (a scheme starts where a run of scheme characters starts, not at each \b inside it: a.b.c.d... would
# make every dot a start and the search quadratic)
_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*://)[^/\s@]*@")


def public_url(url: str) -> str:
    """Return `url` with any user:password removed (also for text that is not a well-formed URL)."""
    return _USERINFO.sub(r"\1", url)


def credentials_stay_home(homes: Callable[[], Iterable[str]]) -> Callable[[Any], None]:
    """Return an httpx request hook that drops the Authorization header of any request whose
    origin is not one of `homes()` (the servers the credential was issued for). A pagination
    link or redirect to another host is still followed, without the credential: public data
    loads, the key never leaves."""

    def hook(request: Any) -> None:
        if "authorization" in request.headers and origin(request.url) not in {origin(h) for h in homes()}:
            del request.headers["authorization"]

    return hook


# -- redaction -----------------------------------------------------------------------------

_SECRET_PATTERNS = [
    re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{8,}"),  # Anthropic
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),  # OpenAI and OpenAI-compatible gateways
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),  # Hugging Face
    re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),  # GitHub
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"),  # Google
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
]
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}")
_ASSIGNED = re.compile(
    r"(?i)((?:api[_-]?key|access[_-]?token|auth[_-]?token|token|secret|password|x-api-key)"
    r"[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}]{6,}"
)
REDACTED = "[REDACTED]"

# The variables a run may take a key from (our clients' and the libraries' they drive): their
# values are redacted whatever their shape, as are the keys and URL passwords a run registers.
SECRET_ENV_VARS = ("OPENAI_API_KEY", "VLLM_API_KEY", "SGLANG_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                   "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# A value shorter than this would blank out ordinary words and numbers; no real key is this short.
MIN_SECRET_CHARS = 4
_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a credential this run was given (a key from a flag or the environment, a URL
    password), so that redact() removes its value from any text, whatever its shape."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _registered.add(value)


def given_secrets() -> list[str]:
    """Return every credential value the run holds (registered, and in SECRET_ENV_VARS), longest first."""
    values = set(_registered)
    values.update(v for name in SECRET_ENV_VARS if len(v := os.environ.get(name, "").strip()) >= MIN_SECRET_CHARS)
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """Return `text` with every credential replaced by [REDACTED]: the values of the keys this run
    was given (whatever their shape), user:password in URLs, and anything shaped like a credential
    (sk-..., sk-ant-..., hf_..., 'Bearer ...', api_key=..., JWTs, ...)."""
    for value in given_secrets():
        text = text.replace(value, REDACTED)
    text = public_url(text)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _ASSIGNED.sub(lambda m: m.group(1) + REDACTED, text)


def error_text(response: httpx.Response | bytes, limit: int = 300) -> str:
    """Return a one-line, redacted summary of an error answer (a read response, or its body): the
    JSON error message when the body has one, else the start of the body; for a redirect (which no
    client here follows), where it points, without user:password; "empty body" for an empty one."""
    if isinstance(response, httpx.Response) and response.is_redirect:
        # A redirect's body is usually empty: the Location is the reason (a login page, https).
        location = response.headers.get("location", "").strip()
        where = f"redirect to {location}" if location else "redirect without a Location"
        return redact(" ".join(where.split()))[:limit] + " (not followed: give the final URL)"
    content = response if isinstance(response, bytes) else response.content
    if not content.strip():
        return "empty body"
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        text = content[: limit * 4].decode("utf-8", "replace")
    else:
        err = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(err, dict):
            text = str(err.get("message") or err)
        elif isinstance(body, dict) and body.get("message"):
            text = str(body["message"])
        else:
            text = str(err)
    return redact(" ".join(text.split()))[:limit]
