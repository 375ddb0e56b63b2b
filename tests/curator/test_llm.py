"""The agents' model clients against local servers speaking the real Anthropic Messages and
OpenAI chat-completions APIs: tool use round trips, retries that honour retry-after, failures
that say what to do."""

from __future__ import annotations

import asyncio
import time

import pytest

from curator.errors import LLMError
from curator.llm import (
    AnthropicClient,
    OpenAIClient,
    RetryPolicy,
    ToolOutcome,
    chat_completions_url,
    make_client,
)
from curator.scout.tools import TOOL_SPECS
from tests.fakes.hostile_server import HostileServer, chat_answer
from tests.fakes.hostile_server import Reply as HostileReply
from tests.fakes.llm_servers import API_KEY, Reply, ScriptedLLMServer, View

SYSTEM = "Agent id: tester\nCategory: coding\nFind datasets."
FAST = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=2.0)


def search_then_finish(view: View) -> Reply:
    if view.turn == 0:
        return Reply("Searching first.", [("search_datasets", {"query": "code", "limit": 3})])
    return Reply("", [("finish", {"summary": f"saw: {view.steps[-1].result}"})])


def anthropic_client(server: ScriptedLLMServer, retry: RetryPolicy = FAST) -> AnthropicClient:
    return AnthropicClient("claude-test", api_key=API_KEY, base_url=server.anthropic_url, retry=retry)


def openai_client(server: ScriptedLLMServer, retry: RetryPolicy = FAST) -> OpenAIClient:
    return OpenAIClient("served-model", server.openai_url, retry=retry)


async def two_turns(client, tool_output: str) -> tuple:
    messages = client.user_message("Begin.")
    first = await client.complete(SYSTEM, messages, TOOL_SPECS)
    messages += client.assistant_messages(first)
    messages += client.tool_result_messages([ToolOutcome(first.tool_calls[0].id, tool_output)], note="2 turns left.")
    second = await client.complete(SYSTEM, messages, TOOL_SPECS)
    await client.aclose()
    return first, second


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_tool_use_round_trip_reads_calls_usage_and_results(api: str) -> None:
    with ScriptedLLMServer(default_script=search_then_finish) as server:
        client = anthropic_client(server) if api == "anthropic" else openai_client(server)
        first, second = asyncio.run(two_turns(client, "3 datasets: a/b, c/d, e/f"))

    assert first.stop_reason == "tool_use"
    assert first.text == "Searching first."
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("search_datasets", {"query": "code", "limit": 3})]
    assert first.input_tokens > 0 and first.output_tokens > 0
    # the second request carried the tool result back in the API's own shape (the server
    # validates ids and role order as the real APIs do, and answered 200)
    assert second.tool_calls[0].name == "finish"
    assert second.tool_calls[0].arguments["summary"] == "saw: 3 datasets: a/b, c/d, e/f"
    assert [r.status for r in server.log] == [200, 200]


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_rate_limit_429_waits_for_retry_after_then_succeeds(api: str) -> None:
    waits: list[float] = []
    with ScriptedLLMServer(default_script=search_then_finish, rate_limited={"tester": 1}, retry_after=0.3) as server:
        client = anthropic_client(server) if api == "anthropic" else openai_client(server)

        async def go():
            turn = await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS, on_retry=lambda a, w, r: waits.append(w))
            await client.aclose()
            return turn

        turn = asyncio.run(go())

    assert turn.tool_calls[0].name == "search_datasets"
    limited, ok = server.log
    assert (limited.status, ok.status) == (429, 200)
    assert ok.start - limited.end >= 0.28  # the server asked for 0.3 s and got it
    assert waits == [pytest.approx(0.3)]
    assert client.retries == 1


def test_overloaded_529_is_retried_with_backoff() -> None:
    with ScriptedLLMServer(default_script=search_then_finish, overloaded={"tester": 2}) as server:
        client = anthropic_client(server)

        async def go():
            turn = await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS)
            await client.aclose()
            return turn

        turn = asyncio.run(go())
    assert [r.status for r in server.log] == [529, 529, 200]
    assert turn.stop_reason == "tool_use"


@pytest.mark.parametrize("status", [400, 500])
def test_persistent_failure_becomes_one_llm_error(status: int) -> None:
    with ScriptedLLMServer(failing={"tester": status}) as server:
        client = anthropic_client(server, RetryPolicy(max_attempts=3, base_delay_s=0.01))

        async def go():
            try:
                await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS)
            finally:
                await client.aclose()

        with pytest.raises(LLMError, match=f"HTTP {status}") as info:
            asyncio.run(go())
    # a bad request is not worth repeating; a server error is, up to the policy's limit
    assert len(server.log) == (1 if status == 400 else 3)
    assert "\n" not in str(info.value)


def test_wrong_key_says_which_variable_to_fix() -> None:
    with ScriptedLLMServer() as server:
        client = AnthropicClient("claude-test", api_key="sk-wrong", base_url=server.anthropic_url, retry=FAST)

        async def go():
            try:
                await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS)
            finally:
                await client.aclose()

        with pytest.raises(LLMError, match="ANTHROPIC_API_KEY"):
            asyncio.run(go())
    assert len(server.log) == 1


def test_missing_key_explains_both_options(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE", "ANTHROPIC_IDENTITY_TOKEN", "ANTHROPIC_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # no profile on disk either
    with pytest.raises(LLMError) as info:
        make_client("anthropic")
    message = str(info.value)
    assert "ANTHROPIC_API_KEY" in message and "--llm openai --base-url" in message
    assert "\n" not in message


def test_anthropic_environment_variables_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    with ScriptedLLMServer(default_script=search_then_finish) as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_url)
        monkeypatch.setenv("CURATOR_MODEL", "claude-from-env")
        client = make_client("anthropic", retry=FAST)

        async def go():
            turn = await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS)
            await client.aclose()
            return turn

        asyncio.run(go())
    assert server.bodies[0]["model"] == "claude-from-env"
    assert server.log[0].status == 200


def test_openai_broken_tool_arguments_are_flagged_not_fatal() -> None:
    def broken(view: View) -> Reply:
        return Reply("", [("search_datasets", '{"query": "code"'), ("finish", {"summary": "ok"})])

    with ScriptedLLMServer(default_script=broken) as server:
        client = openai_client(server)

        async def go():
            turn = await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS)
            # the conversation stays valid when the broken call is answered with an error
            messages = client.user_message("Begin.") + client.assistant_messages(turn)
            messages += client.tool_result_messages([ToolOutcome(c.id, "bad arguments", True) for c in turn.tool_calls])
            await client.complete(SYSTEM, messages, TOOL_SPECS)
            await client.aclose()
            return turn

        turn = asyncio.run(go())
    bad, good = turn.tool_calls
    assert bad.error and "JSON" in bad.error and bad.arguments == {}
    assert good.error is None and good.arguments == {"summary": "ok"}
    assert [r.status for r in server.log] == [200, 200]


def test_openai_needs_base_url_and_model() -> None:
    with pytest.raises(LLMError, match="--base-url"):
        make_client("openai", model="m")
    with pytest.raises(LLMError, match="--model"):
        make_client("openai", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(LLMError, match="unknown --llm"):
        make_client("gemini")


def test_chat_completions_url_accepts_the_usual_base_forms() -> None:
    assert chat_completions_url("http://h:30000") == "http://h:30000/v1/chat/completions"
    assert chat_completions_url("http://h:30000/v1/") == "http://h:30000/v1/chat/completions"
    assert chat_completions_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"


def test_unreachable_server_is_retried_then_reported() -> None:
    client = OpenAIClient("m", "http://127.0.0.1:9/v1", retry=RetryPolicy(max_attempts=2, base_delay_s=0.01))

    async def go():
        try:
            await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS)
        finally:
            await client.aclose()

    start = time.perf_counter()
    with pytest.raises(LLMError, match="cannot reach"):
        asyncio.run(go())
    assert time.perf_counter() - start < 10


# -- issue 49 items 1 and 2: no password in any message; every call bounded in time and size ----

PASSWORD = "Pw-9q7Zx"  # a URL password in no known key shape: only the URL form can give it away


def _hostile(reply: HostileReply) -> HostileServer:
    return HostileServer(lambda request: reply)


def _messages_of(client, retries: int = 1) -> tuple[str, list[str]]:
    """Return (the LLMError's text, every retry reason) of one call against `client`."""
    reasons: list[str] = []

    async def go() -> None:
        try:
            await client.complete(SYSTEM, client.user_message("Begin."), TOOL_SPECS,
                                  on_retry=lambda a, w, r: reasons.append(r))
        finally:
            await client.aclose()

    with pytest.raises(LLMError) as caught:
        asyncio.run(go())
    return str(caught.value), reasons


@pytest.mark.parametrize(("reply", "said"), [
    (HostileReply(b"<html>gateway says hello</html>"), "not JSON"),
    (HostileReply(b'{"error": {"message": "down"}}', status=503), "HTTP 503"),
    (HostileReply(b"", status=302), "HTTP 302"),
    (HostileReply(b'{"choices": []}'), "without choices"),
])
def test_a_url_password_is_sent_as_basic_auth_and_named_in_no_message(reply: HostileReply, said: str) -> None:
    server = _hostile(reply)
    with server:
        base = server.url.replace("http://", f"http://alice:{PASSWORD}@") + "/v1"
        client = OpenAIClient("m", base, retry=RetryPolicy(max_attempts=2, base_delay_s=0.01))
        assert PASSWORD not in client.url and PASSWORD not in client.endpoint
        message, reasons = _messages_of(client)
        sent = server.seen_headers[-1]
    assert said in message and server.url in message, message
    for text in [message, *reasons]:
        assert PASSWORD not in text and "alice" not in text, text
    assert sent["authorization"].startswith("Basic ")  # the credential still reaches the server


def test_chat_completions_url_drops_user_and_password() -> None:
    assert chat_completions_url(f"http://alice:{PASSWORD}@h:30000/v1") == "http://h:30000/v1/chat/completions"


def _slow_answer() -> HostileReply:
    # a valid answer, one byte every 50 ms: httpx's read timeout (the gap between bytes) never fires
    return HostileReply(chat_answer("x" * 200), drip_s=0.05)


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_server_dripping_bytes_is_cut_off_at_the_call_deadline(api: str) -> None:
    with _hostile(_slow_answer()) as server:
        policy = RetryPolicy(max_attempts=2, base_delay_s=0.01)
        client = (AnthropicClient("m", api_key=API_KEY, base_url=server.url, retry=policy, timeout_s=1.0)
                  if api == "anthropic" else OpenAIClient("m", server.url, retry=policy, timeout_s=1.0))
        start = time.perf_counter()
        message, reasons = _messages_of(client)
        took = time.perf_counter() - start
    assert took < 5, took  # two tries of 1 s each, not the ~15 s the drip takes
    assert "no whole answer within 1 s" in message and "gave up after 2 attempts" in message, message
    assert len(reasons) == 1  # a deadline is transient: retried once, then reported


@pytest.mark.parametrize("api", ["anthropic", "openai"])
@pytest.mark.parametrize("chunked", [False, True])
def test_an_answer_past_the_cap_is_refused_unread_and_not_retried(api: str, chunked: bool) -> None:
    big = HostileReply(b'{"pad": "' + b"x" * 3_000_000 + b'"}', chunked=chunked)
    server = _hostile(big)
    with server:
        client = (AnthropicClient("m", api_key=API_KEY, base_url=server.url, retry=FAST, max_answer_bytes=1_000_000)
                  if api == "anthropic" else OpenAIClient("m", server.url, retry=FAST, max_answer_bytes=1_000_000))
        message, reasons = _messages_of(client)
        calls = len(server.seen_headers)
    assert "larger than 1,000,000 bytes" in message, message
    assert reasons == [] and calls == 1  # permanent: the same request would fetch it again
