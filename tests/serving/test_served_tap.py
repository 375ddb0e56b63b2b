"""`curator tap` in front of a real vLLM (CPU build): what the tap stores is what the client received.

The tap runs as its own process (the `curator tap` command, its scrub process included) in front of
the session's target server (the demo's target with the Hermes tool-call parser). Chat requests,
non-streamed and streamed, with tools declared or not, ask for `return_token_ids`: the record's
messages, tools, answer, finish reason and token ids must equal what the client sent and got. A
client that hangs up mid-stream leaves a record marked incomplete, and vLLM stops the request (its
/metrics: nothing running, far fewer tokens made than asked for).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from vllm_process import VllmServer

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


class Tap:
    """`curator tap` as a child process on a free port, in front of `engine`."""

    def __init__(self, engine: str, out: Path) -> None:
        self.out = out
        env = {**os.environ, "COLUMNS": "200"}
        self.proc = subprocess.Popen([sys.executable, "-m", "curator", "tap", "--engine", engine, "--out", str(out),
                                      "--port", "0", "--stats-every", "0", "--seed", "0"],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
        assert self.proc.stderr is not None
        head = []
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            head.append(line)
            found = re.search(r"tap: (http://127\.0\.0\.1:\d+) ->", line)
            if found:
                self.url = found.group(1)
                return
        raise AssertionError(f"curator tap did not start: {''.join(head)}")

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/tap/stats", timeout=10).json()

    def wait(self, key: str, n: int, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats.get(key, 0) >= n or time.monotonic() > deadline:
                return stats
            time.sleep(0.05)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for path in sorted(self.out.glob("tap-*.jsonl"))
                for line in path.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def tap(target_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tap]:
    running = Tap(target_server.url, tmp_path_factory.mktemp("tap"))
    try:
        yield running
    finally:
        running.stop()


def chat(content: str, *, stream: bool = False, max_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    return {"model": "target", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0.0, "return_token_ids": True, "stream": stream, **extra}


def events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]


def assemble(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client makes of a chat stream: choice 0's content, tool calls, finish reason and ids."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    ids: list[int] = []
    finish = None
    prompt_ids = next((e["prompt_token_ids"] for e in evs if e.get("prompt_token_ids")), None)
    for e in evs:
        for c in e["choices"]:
            ids += c.get("token_ids") or []
            finish = c.get("finish_reason") or finish
            delta = c.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                slot["function"]["name"] = (call.get("function") or {}).get("name") or slot["function"]["name"]
                slot["function"]["arguments"] += (call.get("function") or {}).get("arguments") or ""
    return {"content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish,
            "completion_token_ids": ids, "prompt_token_ids": prompt_ids}


def test_the_record_is_what_the_client_received(tap: Tap, target_server: VllmServer):
    sent: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []
    with httpx.Client(timeout=120) as client:
        # non-streamed, twice: once directly, once through the tap (pass-through: the same answer)
        body = chat("How do I read a file in Python?")
        direct = client.post(target_server.url + CHAT, json=body).json()
        via = client.post(tap.url + CHAT, json=body)
        assert via.status_code == 200
        message = via.json()["choices"][0]
        assert message["message"]["content"] == direct["choices"][0]["message"]["content"]
        assert message["token_ids"] == direct["choices"][0]["token_ids"] and via.json()["prompt_token_ids"] == direct["prompt_token_ids"]
        sent.append(body)
        got.append({"content": message["message"]["content"], "tool_calls": message["message"].get("tool_calls") or [],
                    "finish_reason": message["finish_reason"], "completion_token_ids": message["token_ids"],
                    "prompt_token_ids": via.json()["prompt_token_ids"], "usage": via.json()["usage"]})
        # streamed, with usage; streamed with tools declared and a tool call asked for; non-streamed with tools
        for body in (chat("Explain a list comprehension.", stream=True, stream_options={"include_usage": True}),
                     chat("What is the weather in Paris?", stream=True, max_tokens=24, tools=TOOLS,
                          tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                     chat("What is the weather in Rome?", max_tokens=16, tools=TOOLS)):
            r = client.post(tap.url + CHAT, json=body)
            assert r.status_code == 200, r.text
            sent.append(body)
            if body["stream"]:
                assert r.headers["content-type"].startswith("text/event-stream")
                evs = events(r.content)
                got.append({**assemble(evs), "usage": next((e["usage"] for e in evs if e.get("usage")), None)})
            else:
                data = r.json()
                choice = data["choices"][0]
                got.append({"content": choice["message"]["content"], "tool_calls": choice["message"].get("tool_calls") or [],
                            "finish_reason": choice["finish_reason"], "completion_token_ids": choice["token_ids"],
                            "prompt_token_ids": data["prompt_token_ids"], "usage": data["usage"]})
    assert any(g["tool_calls"] for g in got), "no tool call came back: the tool-call case tests nothing"
    stats = tap.wait("recorded", len(sent))
    assert stats.get("recorded") == len(sent) and stats["requests"] == len(sent), stats
    recs = tap.records()
    assert len(recs) == len(sent)
    for body, answer, rec in zip(sent, got, recs):
        assert rec["kind"] == "curator.tap" and rec["version"] == 1 and rec["endpoint"] == "chat" and rec["status"] == 200
        assert rec["model"] == "target" and rec["stream"] is body["stream"] and rec["complete"] is True
        assert rec["messages"] == body["messages"]
        assert rec.get("tools") == body.get("tools")
        assert rec["params"] == {k: v for k, v in body.items() if k not in ("model", "messages", "tools", "stream")}
        assert rec["answer"]["role"] == "assistant"
        assert (rec["answer"]["content"] or "") == (answer["content"] or "")
        assert rec["answer"].get("tool_calls", []) == answer["tool_calls"]
        assert rec["finish_reason"] == answer["finish_reason"]
        assert rec["prompt_token_ids"] == answer["prompt_token_ids"] and len(rec["prompt_token_ids"]) > 5
        assert rec["completion_token_ids"] == answer["completion_token_ids"] and rec["completion_token_ids"]
        assert rec.get("usage") == answer["usage"]


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in vLLM's /metrics")


def test_a_client_gone_mid_stream_is_an_incomplete_record_and_a_stopped_request(tap: Tap, target_server: VllmServer):
    tokens = _metric(target_server.metrics(), "vllm:generation_tokens_total")
    incomplete = tap.stats().get("incomplete", 0)
    # 900 tokens: seconds of work on this CPU, were it not cancelled
    body = chat("Write a long story about a robot.", stream=True, max_tokens=900, ignore_eos=True)
    seen = b""
    with httpx.Client(timeout=120) as client, client.stream("POST", tap.url + CHAT, json=body) as response:
        for chunk in response.iter_raw():
            seen += chunk
            if seen.count(b"token_ids") >= 5:
                break  # a few tokens in, then hang up
    stats = tap.wait("incomplete", incomplete + 1)
    assert stats["incomplete"] == incomplete + 1 and stats["client_disconnected"] >= 1, stats
    deadline = time.monotonic() + 120
    while _metric(target_server.metrics(), "vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    after = target_server.metrics()
    assert _metric(after, "vllm:num_requests_running") == 0
    # vLLM stopped the request (an abort is not among its finished_reason counters): far fewer than 900 tokens
    assert _metric(after, "vllm:generation_tokens_total") - tokens < 450
    rec = tap.records()[-1]
    assert rec["messages"] == body["messages"] and rec["stream"] is True
    assert rec["complete"] is False and rec["finish_reason"] is None
    received = assemble(events(seen.rsplit(b"\n\n", 1)[0] + b"\n\n"))  # the events the client got whole
    # the tap may have forwarded a few chunks the client never read: the record starts with what it read
    assert rec["answer"]["content"].startswith(received["content"]) and len(rec["completion_token_ids"]) < 900
    assert rec["completion_token_ids"][: len(received["completion_token_ids"])] == received["completion_token_ids"]
    assert rec["prompt_token_ids"] == received["prompt_token_ids"]
