"""A `curator tap` log as a build-mix source (`format: tap`, issue 48 item 2): a whole chat exchange becomes
a mix row of the request and the target's own answer, kept (generate requests nothing for it) unless the
source says `regenerate: true`; completions, error statuses, incomplete answers are counted and skipped
with the reason; its held-out split works as a request log's does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from curator.cli import main
from curator.errors import ConfigError
from curator.evaluation.weighting import recorded_serves
from curator.generate import GenerateConfig, generate
from curator.mix import load_recipe, open_mix, recipe_from_dict
from curator.mix.build import build_mix
from curator.mix.prompts import mix_prompts
from curator.tap.record import Exchange, build_record
from tests.fakes.openai_server import FakeOpenAIServer

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
TOPICS = ("a socket server", "a CSV parser", "a thread pool", "an LRU cache", "a JSON schema check", "a retry loop",
          "a rate limiter", "a trie", "a priority queue", "a log rotator", "an HTTP router", "a config loader")


def config(mix: Path, out: Path, server: FakeOpenAIServer) -> GenerateConfig:
    return GenerateConfig(mix=mix, out=out, model="target", endpoints=[server.url], retry_base_s=0.01, concurrency=4)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for shard in sorted(out.glob("shard-*.jsonl")) for line in shard.read_text().splitlines()]


def _chat(question: str, answer: str, *, stream: bool = False, status: int = 200, delivered: bool = True,
          tools: list | None = None, calls: list | None = None) -> dict:
    """A tap record made by the tap's own record builder from the bytes an engine sent."""
    request = {"model": "target", "messages": [{"role": "system", "content": "You are a careful engineer."},
                                               {"role": "user", "content": question}], "temperature": 0}
    if tools:
        request["tools"] = tools
    message: dict = {"role": "assistant", "content": answer}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else "stop"
    if status != 200:
        chunks = [json.dumps({"error": {"message": "engine overloaded"}}).encode()]
    elif stream:
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": answer[:10]}}]},
                  {"choices": [{"index": 0, "delta": {"content": answer[10:]}}]}]
        if delivered:
            events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        chunks = [b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)]
    else:
        chunks = [json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": finish}]}).encode()]
    exchange = Exchange("chat", json.dumps(request).encode(), status, chunks, streamed=stream, delivered=delivered,
                        time=time.time())
    return build_record(exchange, request, lambda text: text)


def _completions() -> dict:
    request = {"model": "target", "prompt": "def fibonacci(n):"}
    body = json.dumps({"choices": [{"index": 0, "text": "\n    return n", "finish_reason": "stop"}]}).encode()
    return build_record(Exchange("completions", json.dumps(request).encode(), 200, [body], time=time.time()), request,
                        lambda text: text)


def _log(folder: Path) -> Path:
    """A tap folder of two rotated files: 14 whole chat exchanges (one with a tool call), and five that are not."""
    tap = folder / "tapped"
    tap.mkdir()
    whole = [_chat(f"Write {topic} in Python, with tests, number {i}.", f"Here is {topic}: def solve(): return {i}",
                   stream=i % 2 == 1) for i, topic in enumerate(TOPICS)]
    whole.append(_chat("Read setup.py and tell me the version.", "", tools=TOOLS,
                       calls=[{"id": "call_1", "type": "function",
                               "function": {"name": "read_file", "arguments": "{\"path\": \"setup.py\"}"}}]))
    whole.append(_chat("Why is the sky blue? Explain it to a child.", "Because air scatters blue light the most."))
    skipped = [_completions(), _chat("Sort this list for me.", "", status=503),
               _chat("Summarise this long email thread.", "The thread says", stream=True, delivered=False),
               _chat("Explain recursion.", "Recursion is a function calling itself.", status=400)]
    reasoning = _chat("What is 17 * 23? Think first.", "391.")
    reasoning["answer"]["reasoning_content"] = "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391"
    lines = [json.dumps(r) for r in [*whole[:8], *skipped[:2]]], [json.dumps(r) for r in [*whole[8:], *skipped[2:], reasoning]]
    (tap / "tap-20261205T160000.000000Z.jsonl").write_text("\n".join(lines[0]) + "\n")
    (tap / "tap-20261205T161500.000000Z.jsonl").write_text("\n".join(lines[1]) + "\n")
    return tap


def _recipe(folder: Path, extra: str = "") -> Path:
    path = folder / "recipe.yaml"
    path.write_text(f"name: tapped\nsources:\n  - path: tapped\n    name: tap\n    format: tap\n    samples: 100\n{extra}"
                    "dedup: {exact: true, near: false}\n")
    return path


def test_a_tap_log_becomes_rows_that_keep_the_targets_own_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(tmp_path)
    out = tmp_path / "mix"
    assert main(["build-mix", "--recipe", str(_recipe(tmp_path)), "--out", str(out),
                 "--catalog", str(tmp_path / "c.duckdb")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    source = open_mix(out).manifest["sources"][0]
    assert (source["format"], source["turns"], source["keep_responses"]) == ("tap", "last", True)
    assert (source["read"], source["kept"], source["malformed"], source["filtered"]) == (19, 14, 0, 5)
    assert source["filtered_reasons"] == {
        "answer with reasoning, which a mix row cannot carry (regenerate: true answers it again)": 1,
        "completions endpoint (a prompt, not a chat conversation)": 1,
        "engine status 400": 1, "engine status 503": 1,
        "incomplete answer (the client left mid-answer, or the stream ended without a finish reason)": 1}
    assert "filtered in tap: " in err and "engine status 503 (1)" in err
    rows = {r.messages[1]["content"]: r for r in open_mix(out).rows()}
    assert len(rows) == 14 and all(r.keep_responses and r.turns == "last" for r in rows.values())
    socket = rows["Write a socket server in Python, with tests, number 0."]
    assert [m["role"] for m in socket.messages] == ["system", "user", "assistant"]
    assert socket.messages[-1]["content"] == "Here is a socket server: def solve(): return 0"
    streamed = rows["Write a CSV parser in Python, with tests, number 1."]  # put together from the stream's deltas
    assert streamed.messages[-1]["content"] == "Here is a CSV parser: def solve(): return 1"
    tool = rows["Read setup.py and tell me the version."]
    assert tool.tools is not None and tool.tools[0]["function"]["name"] == "read_file"
    assert tool.messages[-1]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": "{\"path\": \"setup.py\"}"}
    # classified on the request, as `curator profile` reads the same log
    assert socket.category == "code" and rows["Why is the sky blue? Explain it to a child."].category != "code"
    ids = pq.read_table(sorted(out.glob("*.parquet")), columns=["source_id"]).column("source_id").to_pylist()
    assert len(ids) == 14 and all(isinstance(i, str) and len(i) == 32 for i in ids)  # the tap record's id, to trace a row back


def test_generate_keeps_the_tapped_answers_and_regenerate_asks_again(tmp_path: Path) -> None:
    _log(tmp_path)
    build_mix(load_recipe(_recipe(tmp_path)), tmp_path / "kept")
    build_mix(load_recipe(_recipe(tmp_path, "    regenerate: true\n")), tmp_path / "asked")
    asked_rows = list(open_mix(tmp_path / "asked").rows())
    # the answer with reasoning is no obstacle once only its request is kept
    assert len(asked_rows) == 15 and not any(r.keep_responses for r in asked_rows)
    assert all(r.messages[-1]["role"] == "user" for r in asked_rows)  # the request alone, for the target to answer
    with FakeOpenAIServer() as server:
        stats = generate(config(tmp_path / "kept", tmp_path / "gen-kept", server))
        asked = generate(config(tmp_path / "asked", tmp_path / "gen-asked", server))
    # nothing was requested for the kept rows (the server saw only generate's start-up check)
    assert stats.kept == 14 and stats.generated == 0 and sum(stats.requests_by_endpoint.values()) == 0
    kept = {r["messages"][1]["content"]: r for r in records(tmp_path / "gen-kept")}
    socket = kept["Write a socket server in Python, with tests, number 0."]
    assert socket["finish_reason"] == "kept" and socket["keep_responses"] is True
    assert [(m["role"], m["train"]) for m in socket["messages"]] == [("system", False), ("user", False), ("assistant", True)]
    assert socket["messages"][-1]["content"] == "Here is a socket server: def solve(): return 0"
    assert asked.generated == 15 and sum(asked.requests_by_endpoint.values()) >= 15
    assert len(records(tmp_path / "gen-asked")) == 15


def test_a_tap_sources_heldout_split_holds_the_requests_and_stays_out_of_the_mix(tmp_path: Path) -> None:
    _log(tmp_path)
    manifest = build_mix(load_recipe(_recipe(tmp_path, "    heldout: 4\n")), tmp_path / "mix")
    held, malformed = mix_prompts(tmp_path / "mix" / ".heldout")  # what `curator eval --prompts MIX/.heldout` reads
    assert malformed == 0 and manifest["heldout"]["conversations"] == 4 and len(held) == manifest["heldout"]["rows"] == 4
    assert all(p.messages[-1]["role"] == "user" for p in held)  # the request the eval asks, not the tapped answer
    serves, _ = recorded_serves(tmp_path / "mix" / ".heldout")  # what `curator eval --profile` weights them by
    assert {p.category for p in held} <= set(serves) and all(serves[p.category] == p.category for p in held)
    users = {p.messages[-1]["content"] for p in held}
    kept = {r.messages[1]["content"] for r in open_mix(tmp_path / "mix").rows()}
    assert len(kept) == 10 and not users & kept
    assert manifest["sources"][0]["heldout"] == 4 and manifest["sources"][0]["kept"] == 10


def test_a_tap_log_of_nothing_whole_says_why_and_writes_no_mix(tmp_path: Path) -> None:
    tap = tmp_path / "tapped"
    tap.mkdir()
    (tap / "tap-1.jsonl").write_text("".join(json.dumps(_chat(f"Question {i}?", "", status=500)) + "\n" for i in range(5)))
    with pytest.raises(ConfigError, match=r"tap: 5 read, 5 filtered \(engine status 500: 5\)"):
        build_mix(load_recipe(_recipe(tmp_path)), tmp_path / "mix")
    (tap / "tap-1.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "a plain request log"}]}) + "\n")
    with pytest.raises(ConfigError, match="not a tap record"):
        build_mix(load_recipe(_recipe(tmp_path)), tmp_path / "mix")
    assert not (tmp_path / "mix").exists()


@pytest.mark.parametrize("extra, message", [
    ("    keep_responses: true\n", "a tap source keeps the target's own answers already"),
    ("    category: code\n", "categories come from the traffic classifier"),
])
def test_a_tap_source_refuses_what_does_not_apply(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_recipe(_recipe(tmp_path, extra))


def test_regenerate_applies_only_to_a_tap_source() -> None:
    with pytest.raises(ConfigError, match="regenerate applies to a tap source"):
        recipe_from_dict({"name": "x", "sources": [{"path": "a.jsonl", "samples": 1, "regenerate": True}]})
    with pytest.raises(ConfigError, match="at most one traffic source"):
        recipe_from_dict({"name": "x", "sources": [{"path": "a", "format": "tap", "samples": 1},
                                                   {"path": "b", "format": "traffic", "samples": 1}]})


def test_what_a_tap_log_skips_is_counted_over_the_whole_log_whatever_the_quota(tmp_path: Path) -> None:
    _log(tmp_path)
    recipe = _recipe(tmp_path)
    recipe.write_text(recipe.read_text().replace("samples: 100", "samples: 2"))
    source = build_mix(load_recipe(recipe), tmp_path / "mix")["sources"][0]
    assert (source["kept"], source["filtered"], source["malformed"]) == (2, 5, 0)
    assert source["examined"] + source["unsampled"] == source["read"] == 19
