"""The data side's one HTTP layer (curator/http.py): which statuses are retried, how long a
client waits, what Retry-After means, base URLs, where a credential may go, and redaction."""

from __future__ import annotations

import asyncio
import email.utils
import time

import httpx
import pytest

from curator import http
from curator.http import Failure, RetryPolicy


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 504, 520, 524, 529])
def test_transient_statuses_are_retried(status: int) -> None:
    assert http.is_transient(status)


@pytest.mark.parametrize("status", [200, 301, 400, 401, 403, 404, 413, 422, 501, 505, 511])
def test_permanent_statuses_are_not(status: int) -> None:
    assert not http.is_transient(status)


def test_every_client_uses_the_one_status_set() -> None:
    import curator.generate.client as generate_client
    import curator.engines.vllm_capture as vllm_capture
    import curator.hub as hub
    import curator.llm as llm

    for module in (llm, generate_client, vllm_capture, hub):
        names = {n for n in vars(module) if "TRANSIENT" in n or "RETRYABLE" in n}
        assert not names, f"{module.__name__} keeps its own status set: {names}"


def test_retry_after_seconds_date_and_milliseconds() -> None:
    assert http.parse_retry_after(httpx.Headers({"Retry-After": "7"})) == 7.0
    assert http.parse_retry_after(httpx.Headers({"retry-after-ms": "250"})) == 0.25
    in_30_s = email.utils.formatdate(time.time() + 30, usegmt=True)
    wait = http.parse_retry_after(httpx.Headers({"Retry-After": in_30_s}))
    assert wait is not None and 28 <= wait <= 30
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    assert http.parse_retry_after(httpx.Headers({"Retry-After": past})) == 0.0
    assert http.parse_retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert http.parse_retry_after(httpx.Headers({})) is None


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay_s=1.0, max_delay_s=8.0)
    for attempt, full in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        waits = [policy.delay(attempt) for _ in range(50)]
        assert all(full * 0.5 <= w <= full for w in waits) and len(set(waits)) > 1
    assert policy.delay(1, retry_after=3.0) == 3.0  # the server's word wins
    assert policy.delay(1, retry_after=600.0) == 8.0  # ... up to the cap


def test_retrying_stops_at_permanent_failures_and_after_the_last_attempt() -> None:
    calls: list[int] = []
    waits: list[float] = []

    async def flaky(attempt: int) -> str:
        calls.append(attempt)
        if attempt < 3:
            raise ValueError("busy")
        return "ok"

    def transient(exc: Exception) -> Failure | None:
        return Failure(str(exc), True, 0.0) if isinstance(exc, ValueError) else None

    policy = RetryPolicy(max_attempts=3, base_delay_s=0.001)
    assert asyncio.run(http.retrying(flaky, policy, transient, lambda a, w, r: waits.append(w))) == "ok"
    assert calls == [1, 2, 3] and waits == [0.0, 0.0]

    calls.clear()
    with pytest.raises(ValueError):
        asyncio.run(http.retrying(flaky, RetryPolicy(max_attempts=2, base_delay_s=0.001), transient))
    assert calls == [1, 2]

    calls.clear()
    with pytest.raises(ValueError):
        asyncio.run(http.retrying(flaky, policy, lambda exc: Failure(str(exc), False)))
    assert calls == [1]


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://h:30000", "http://h:30000"),
        ("http://h:30000/", "http://h:30000"),
        ("  http://h:30000/v1/ ", "http://h:30000"),
        ("https://h/v1/chat/completions", "https://h"),
        ("http://h:8000/v1/completions", "http://h:8000"),
        ("https://gateway.example/openai", "https://gateway.example/openai"),
    ],
)
def test_base_url_forms(given: str, root: str) -> None:
    assert http.base_url(given) == root


@pytest.mark.parametrize("bad", ["h:30000", "ftp://h", "http://", ""])
def test_base_url_refuses_what_is_not_http(bad: str) -> None:
    with pytest.raises(ValueError, match="http"):
        http.base_url(bad)


def test_credential_is_dropped_on_requests_to_another_origin() -> None:
    hook = http.credentials_stay_home(lambda: ["https://huggingface.co"])
    home = httpx.Request("GET", "https://huggingface.co/api/datasets?cursor=2", headers={"Authorization": "Bearer hf_x"})
    away = httpx.Request("GET", "https://evil.example/api/datasets?cursor=2", headers={"Authorization": "Bearer hf_x"})
    other_port = httpx.Request("GET", "https://huggingface.co:8443/api", headers={"Authorization": "Bearer hf_x"})
    for request in (home, away, other_port):
        hook(request)
    assert home.headers.get("authorization") == "Bearer hf_x"
    assert "authorization" not in away.headers and "authorization" not in other_port.headers


@pytest.mark.parametrize(
    "secret",
    [
        "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv",
        "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx",
        "hf_AbCdEfGhIjKlMnOpQrStUv",
        "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    ],
)
def test_redact_removes_key_shaped_strings(secret: str) -> None:
    text = http.redact(f'invalid key {secret}; {{"api_key": "{secret}"}}, Authorization: Bearer {secret}')
    assert secret not in text and "[REDACTED]" in text


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "HTTP 400: max_tokens=4096 is too large for model sk-model (context 8192); see docs"
    assert http.redact(text) == text


def test_error_text_reads_the_json_message_and_redacts_it() -> None:
    response = httpx.Response(401, json={"error": {"message": "Incorrect API key provided: sk-abcdefghijklmnop1234"}})
    assert http.error_text(response) == "Incorrect API key provided: [REDACTED]"
    assert http.error_text(httpx.Response(502, text="<html>\n bad gateway \n</html>")) == "<html> bad gateway </html>"


def test_redact_removes_the_value_of_every_key_the_run_holds_whatever_its_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "plainword-7")
    http.register_secret("Zq9.x")
    text = http.redact("engine said: key plainword-7 and Zq9.x refused at http://bob:hunter22@h:8000/v1")
    assert text == "engine said: key [REDACTED] and [REDACTED] refused at http://h:8000/v1"


def test_url_credentials_are_split_off_and_sent_as_basic_auth() -> None:
    public, auth = http.split_credentials("http://alice:p%40ss@h:30000/v1")
    assert public == "http://h:30000/v1" and http.public_url("https://tok@h/x") == "https://h/x"
    request = next(auth.auth_flow(httpx.Request("GET", public)))  # type: ignore[union-attr]
    assert request.headers["authorization"] == httpx.BasicAuth("alice", "p@ss").auth_flow(
        httpx.Request("GET", public)).__next__().headers["authorization"]
    assert http.redact("p@ss leaked") == "[REDACTED] leaked"
    assert http.split_credentials("http://h:1") == ("http://h:1", None)


def test_a_password_with_a_question_mark_or_hash_is_removed_whole() -> None:
    from curator.http import public_url

    for url in ("https://u:p?x@host.com/v1", "https://u:p#x@host.com/v1"):
        assert public_url(url) == "https://host.com/v1"


def test_error_text_names_a_redirects_location_without_credentials_and_an_empty_body() -> None:
    """Issue 49 item 11: "HTTP 302 to GET /v1/models:" was followed by nothing."""
    request = httpx.Request("GET", "http://h:8000/v1/models")
    moved = httpx.Response(302, headers={"location": "https://bob:Pw-9q7Zx@login.example/sso?next=/v1"}, request=request)
    text = http.error_text(moved)
    assert text.startswith("redirect to https://login.example/sso?next=/v1") and "not followed" in text
    assert "Pw-9q7Zx" not in text and "bob" not in text
    assert http.error_text(httpx.Response(307, request=request)) == "redirect without a Location (not followed: give the final URL)"
    assert http.error_text(httpx.Response(500, content=b"  \n", request=request)) == "empty body"
    assert http.error_text(b"") == "empty body"


def test_a_redirected_models_check_names_the_status_and_where_it_points() -> None:
    """Issue 49 item 11: generate's start-up check said "HTTP 302 to GET /v1/models:" and nothing more."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from curator.errors import EndpointError
    from curator.generate.client import EndpointClient

    class Moved(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(302)
            self.send_header("Location", "https://carol:Pw-9q7Zx@sso.example/login?next=%2Fv1%2Fmodels")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = EndpointClient(f"http://127.0.0.1:{server.server_address[1]}", 1)

    async def check() -> None:
        try:
            await client.check("m", {}, RetryPolicy(max_attempts=1))
        finally:
            await client.aclose()

    try:
        with pytest.raises(EndpointError) as caught:
            asyncio.run(check())
    finally:
        server.shutdown()
    said = str(caught.value)
    assert "HTTP 302 to GET /v1/models: redirect to https://sso.example/login" in said, said
    assert "Pw-9q7Zx" not in said and "carol" not in said
