"""The tap in front of a fake engine: answers pass through unchanged, the record holds what the
client received, credentials and personal data never reach the disk, failures stay the tap's own."""

from __future__ import annotations

import errno
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from curator.tap.writer import TapLog
from tests.curator.tap.conftest import records
from tests.curator.tap.fake_engine import ERROR_MARKER

CHAT = "/v1/chat/completions"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _chat(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "target", "messages": [{"role": "user", "content": "What is the answer?"}], "stream": stream,
            "return_token_ids": True, "temperature": 0.0, **extra}


def _events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]


def test_non_streamed_chat_passes_through_and_is_recorded_as_received(engine, make_tap, tmp_path):
    tap = make_tap(engine.url)
    direct = httpx.post(engine.url + CHAT, json=_chat())
    via = httpx.post(tap.url + CHAT, json=_chat())
    assert via.status_code == 200 and via.content == direct.content
    tap.flush(1)
    [rec] = records(tmp_path / "tap")
    got = via.json()
    assert rec["kind"] == "curator.tap" and rec["version"] == 1 and len(rec["id"]) == 32
    assert rec["endpoint"] == "chat" and rec["model"] == "target" and rec["stream"] is False and rec["status"] == 200
    assert rec["messages"] == _chat()["messages"]
    assert rec["params"] == {"return_token_ids": True, "temperature": 0.0}
    assert rec["answer"] == got["choices"][0]["message"]
    assert rec["finish_reason"] == "stop" and rec["complete"] is True
    assert rec["prompt_token_ids"] == got["prompt_token_ids"] and rec["completion_token_ids"] == got["choices"][0]["token_ids"]
    assert rec["usage"] == got["usage"]


def test_streamed_chat_with_tools_is_recorded_as_the_client_assembled_it(engine, make_tap, tmp_path):
    tap = make_tap(engine.url)
    body = _chat(stream=True, tools=TOOLS)
    direct = httpx.post(engine.url + CHAT, json=body)
    via = httpx.post(tap.url + CHAT, json=body)
    assert via.content == direct.content and via.headers["content-type"].startswith("text/event-stream")
    tap.flush(1)
    [rec] = records(tmp_path / "tap")
    events = _events(via.content)
    args = "".join(e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for e in events if e["choices"][0].get("delta", {}).get("tool_calls"))
    assert rec["tools"] == TOOLS and rec["stream"] is True and rec["complete"] is True
    assert rec["answer"]["tool_calls"] == [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]
    assert rec["finish_reason"] == "tool_calls"
    assert rec["completion_token_ids"] == [i for e in events for i in e["choices"][0].get("token_ids", [])]
    assert rec["prompt_token_ids"] == events[0]["prompt_token_ids"]


def test_completions_streamed_and_not(engine, make_tap, tmp_path):
    tap = make_tap(engine.url)
    for stream in (False, True):
        via = httpx.post(tap.url + "/v1/completions", json={"model": "target", "prompt": "Once upon", "stream": stream, "return_token_ids": True})
        assert via.status_code == 200
    tap.flush(2)
    plain, streamed = records(tmp_path / "tap")
    assert plain["endpoint"] == streamed["endpoint"] == "completions" and plain["prompt"] == "Once upon"
    assert plain["answer"] == streamed["answer"] == {"text": "The answer is forty-two."}
    assert plain["prompt_token_ids"] == streamed["prompt_token_ids"] == [1, 2, 3]
    assert streamed["completion_token_ids"] == list(range(100, 106)) and "messages" not in plain


def test_engine_error_passes_through_exactly(engine, make_tap, tmp_path):
    tap = make_tap(engine.url)
    body = {"model": "target", "messages": [{"role": "user", "content": ERROR_MARKER}]}
    direct = httpx.post(engine.url + CHAT, json=body)
    via = httpx.post(tap.url + CHAT, json=body)
    assert (via.status_code, via.reason_phrase, via.content) == (503, "Service Unavailable", direct.content)
    assert via.headers["x-engine-error"] == "overloaded" and via.headers["retry-after"] == "7"
    tap.flush(1)
    [rec] = records(tmp_path / "tap")
    assert rec["status"] == 503 and "answer" not in rec


def test_other_paths_forwarded_unchanged_and_not_recorded(engine, make_tap, tmp_path):
    tap = make_tap(engine.url)
    for path in ("/v1/models", "/metrics", "/health"):
        direct, via = httpx.get(engine.url + path), httpx.get(tap.url + path)
        assert (via.status_code, via.content, via.headers["content-type"]) == (direct.status_code, direct.content, direct.headers["content-type"])
    time.sleep(0.1)
    assert records(tmp_path / "tap") == []
    stats = httpx.get(tap.url + "/tap/stats").json()
    assert stats["requests"] == 3 and stats["sampled"] == 0


def test_an_unreachable_engine_is_a_502_named_by_the_tap(make_tap):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tap = make_tap(f"http://127.0.0.1:{port}")
    via = httpx.post(tap.url + CHAT, json=_chat())
    assert via.status_code == 502 and "curator tap: engine unreachable" in via.json()["error"]["message"]


def test_credentials_are_forwarded_but_never_recorded_and_text_is_scrubbed(engine, make_tap, tmp_path):
    tap = make_tap(engine.url)
    key = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
    headers = {"Authorization": f"Bearer {key}", "api-key": "secret-api-key-value", "Cookie": "session=cookie-value-123"}
    body = {"model": "target", "return_token_ids": True, "user": "jane.doe@example.com",
            "messages": [{"role": "user", "content": f"Mail me at jane.doe@example.com, my key is {key}"}]}
    assert httpx.post(tap.url + CHAT, json=body, headers=headers).status_code == 200
    assert engine.seen_headers[-1]["authorization"] == f"Bearer {key}" and engine.seen_headers[-1]["cookie"] == "session=cookie-value-123"
    assert json.loads(engine.seen_bodies[-1]) == body  # forwarded unchanged
    tap.flush(1)
    disk = b"".join(p.read_bytes() for p in (tmp_path / "tap").iterdir())
    for secret in (key, "secret-api-key-value", "cookie-value-123", "jane.doe@example.com"):
        assert secret.encode() not in disk
    [rec] = records(tmp_path / "tap")
    assert "[EMAIL]" in rec["messages"][0]["content"] and "user" not in rec["params"]
    assert "prompt_token_ids" not in rec  # ids of a scrubbed prompt would spell the address back out
    assert rec["completion_token_ids"] == list(range(100, 106))  # the answer was not changed: its ids stay


def test_client_disconnect_mid_stream_cancels_the_engine_and_marks_the_record(engine, make_tap, tmp_path):
    engine.chunk_delay, engine.chunks = 0.05, 60
    tap = make_tap(engine.url)
    with httpx.Client() as client, client.stream("POST", tap.url + CHAT, json=_chat(stream=True)) as response:
        for _ in response.iter_raw():
            break  # the first chunk, then hang up
    tap.flush(1)
    deadline = time.monotonic() + 5
    while engine.cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.cancelled == 1
    [rec] = records(tmp_path / "tap")
    assert rec["complete"] is False and rec["finish_reason"] is None
    assert httpx.get(tap.url + "/tap/stats").json()["client_disconnected"] == 1


class FullDisk(TapLog):
    def write(self, lines: list[bytes]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


class SlowDisk(TapLog):
    def write(self, lines: list[bytes]) -> None:
        time.sleep(1.0)
        super().write(lines)


def test_a_full_disk_stops_recording_never_a_request(engine, make_tap, tmp_path):
    tap = make_tap(engine.url, log=FullDisk(tmp_path / "tap", max_file_bytes=1000, max_total_bytes=10_000))
    for _ in range(5):
        assert httpx.post(tap.url + CHAT, json=_chat()).status_code == 200
    tap.flush(5)
    stats = httpx.get(tap.url + "/tap/stats").json()
    assert stats["dropped_write_error"] == 5 and stats["write_errors"] == 1 and stats.get("recorded", 0) == 0
    assert stats["recording"] is False and "No space left" in stats["last_error"]


def test_a_slow_writer_never_delays_a_request(engine, make_tap, tmp_path):
    tap = make_tap(engine.url, log=SlowDisk(tmp_path / "tap", max_file_bytes=1 << 20, max_total_bytes=1 << 22), queue_size=2)
    start = time.monotonic()
    with httpx.Client() as client:
        for _ in range(20):
            assert client.post(tap.url + CHAT, json=_chat(stream=True)).status_code == 200
    assert time.monotonic() - start < 1.0  # the writer alone takes 1 s per batch
    assert httpx.get(tap.url + "/tap/stats").json()["dropped_queue_full"] >= 15


def test_rate_and_category_caps(engine, make_tap, tmp_path):
    tap = make_tap(engine.url, rate=0.0)
    for _ in range(3):
        httpx.post(tap.url + CHAT, json=_chat())
    assert httpx.get(tap.url + "/tap/stats").json()["sampled"] == 0
    capped = make_tap(engine.url, caps={"chat": 2, "code": 0})
    for text in ("hello there", "how are you", "nice day", "```python\ndef f(x):\n    return x\n```\nFix this function, it raises TypeError"):
        httpx.post(capped.url + CHAT, json={"model": "target", "messages": [{"role": "user", "content": text}]})
    capped.flush(4)
    assert [r["messages"][0]["content"] for r in records(tmp_path / "tap")] == ["hello there", "how are you"]
    stats = httpx.get(capped.url + "/tap/stats").json()
    assert stats["dropped_cap"] == 2 and stats["per_category"] == {"chat": 2}


def test_tap_folder_is_traffic_for_profile(engine, make_tap, tmp_path):
    from typer.testing import CliRunner

    from curator.cli import app

    tap = make_tap(engine.url)
    httpx.post(tap.url + CHAT, json=_chat(tools=TOOLS))
    httpx.post(tap.url + CHAT, json={"model": "target", "messages": [{"role": "user", "content": "Prove that sqrt(2) is irrational step by step"}]})
    httpx.post(tap.url + "/v1/completions", json={"model": "target", "prompt": "Write a haiku about rain"})
    tap.flush(3)
    (tmp_path / "tap" / "tap-99999999.jsonl").write_bytes(b'{"kind": "curator.tap", "messa')  # a torn last line: skipped, counted
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["profile", "--traffic", str(tmp_path / "tap"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    profile = json.loads(out.read_text())
    assert sum(c["rows"] for c in profile["categories"].values()) == 3
    assert profile["categories"]["agentic"]["rows"] == 1


def test_log_rotates_by_size_and_keeps_the_disk_bound(tmp_path: Path):
    log = TapLog(tmp_path, max_file_bytes=1000, max_total_bytes=3000)
    line = b'{"x": "' + b"y" * 90 + b'"}\n'  # 100 bytes
    for _ in range(100):
        log.write([line])
    files = log.files()
    assert all(p.stat().st_size <= 1000 for p in files)
    assert sum(p.stat().st_size for p in files) <= 3000 and log.removed >= 6
    assert files[-1] == log.path and all(ln == line for p in files for ln in p.read_bytes().splitlines(keepends=True))
    log.close()
