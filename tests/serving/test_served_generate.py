"""`curator generate` against a real vLLM (CPU build), judged by the engine itself.

Token mode: every stored prompt's ids are the ids vLLM's own chat endpoint builds for the same
messages and tools (its `return_token_ids`), and the stored completion ids are what the engine answers
there, for single-turn, multi-turn (the target's own earlier answers as history), a conversation with
earlier tool calls and their results, and tools declared. Chat mode: the stored answers are the
engine's chat answers and the training rows' prompts are its prompt ids. A run SIGKILLed mid-way
resumes with every id exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_process import VllmServer

MAX_TOKENS = 16
WORDS = "the draft model reads three layers of the target and writes a token per step".split()


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": f"Call {name}", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def sentence(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(n))


def write_mix(root: Path, rows: int = 4) -> Path:
    """Build a mix with every conversation shape token mode must render as the engine does."""
    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    chat = [{"id": f"single{i}", "messages": [{"role": "user", "content": sentence(i)}]} for i in range(rows)]
    chat += [{"id": f"multi{i}", "messages": [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": sentence(i)}, {"role": "assistant", "content": "an answer to replace"},
        {"role": "user", "content": sentence(i + 1, 4)}, {"role": "assistant", "content": "another"},
        {"role": "user", "content": sentence(i + 2, 3)}]} for i in range(rows)]
    # earlier tool calls and their results, answered at the end (turns: last keeps the context as is)
    calls = [{"id": f"calls{i}", "tools": [tool("get_weather"), tool("get_time")], "messages": [
        {"role": "user", "content": f"Please run get_weather for city{i}."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": f"city{i}"})}}]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps({"city": f"city{i}", "result": "ok"})},
        {"role": "user", "content": sentence(i, 3)}]} for i in range(rows)]
    declared = [{"id": f"declared{i}", "tools": [tool("get_time")],
                 "messages": [{"role": "user", "content": f"What time is it in city{i}? {sentence(i, 3)}"}]}
                for i in range(rows)]
    sources = []
    for name, data, turns in (("chat", chat, "all"), ("calls", calls, "last"), ("declared", declared, "all")):
        path = src / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
        sources.append({"path": str(path), "name": name, "format": "messages", "samples": len(data),
                        "category": "agentic" if name != "chat" else "chat", "turns": turns})
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "serving", "seed": 0, "sources": sources,
                                      "dedup": {"exact": False, "near": False}}))
    out = root / "mix"
    build_mix(load_recipe(recipe), out)
    return out


def records(gen_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for shard in sorted(gen_dir.glob("shard-*.jsonl"))
            for line in shard.read_text().splitlines() if line.strip()]


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's messages as a client sends them to a chat endpoint (the toolkit's `train` flag dropped)."""
    keep = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
    return [{k: m[k] for k in keep if k in m} for m in messages]


def engine_chat(server: VllmServer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    body: dict[str, Any] = {"model": server.served_name, "messages": messages, "max_tokens": max_tokens,
                            "temperature": 0.0, "return_token_ids": True, "skip_special_tokens": False}
    if tools:
        body["tools"] = tools
    return server.post("/v1/chat/completions", body)


def run_generate(*argv: str) -> None:
    from curator.cli import main

    out = Path(argv[argv.index("--out") + 1])
    assert main(["generate", *argv, "--catalog", str(out.parent / "catalog.duckdb")]) == 0


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory, demo: Path) -> Path:
    return write_mix(tmp_path_factory.mktemp("serving-mix"))


def test_token_mode_ids_are_the_engines_own(target_server: VllmServer, demo: Path, mix: Path,
                                            tmp_path: Path) -> None:
    out = tmp_path / "gen"
    run_generate("--mix", str(mix), "--out", str(out), "--endpoint", target_server.url, "--model", "target",
                 "--engine", "vllm", "--tokenizer", str(demo / "target"), "--temperature", "0",
                 "--max-tokens", str(MAX_TOKENS), "--concurrency", "4")
    recs = records(out)
    assert len({r["id"] for r in recs}) == len(recs) == 16
    shapes: dict[str, int] = {"single-turn": 0, "multi-turn": 0, "earlier tool calls": 0, "tools declared": 0}
    for rec in recs:
        assert rec["mode"] == "token", rec.get("mode_reason")
        for gen in rec["generations"]:
            history = openai_messages(rec["messages"][: gen["message"]])
            answer = engine_chat(target_server, history, rec.get("tools"))
            assert gen["prompt_ids"] == answer["prompt_token_ids"], (rec["id"], gen["message"])
            assert gen["completion_ids"] == answer["choices"][0]["token_ids"], (rec["id"], gen["message"])
        users = sum(m["role"] == "user" for m in rec["messages"])
        shapes["single-turn"] += rec["source"] == "chat" and users == 1
        # later prompts hold the target's own earlier answers as history
        shapes["multi-turn"] += rec["source"] == "chat" and len(rec["generations"]) == users == 3
        shapes["earlier tool calls"] += rec["source"] == "calls" and any(m.get("tool_calls") for m in rec["messages"]) \
            and any(m["role"] == "tool" for m in rec["messages"])
        shapes["tools declared"] += bool(rec.get("tools"))
    assert shapes == {"single-turn": 4, "multi-turn": 4, "earlier tool calls": 4, "tools declared": 8}, shapes


def test_chat_mode_stores_the_engines_answers(target_server: VllmServer, demo: Path, mix: Path,
                                              tmp_path: Path) -> None:
    """`--engine chat` (text mode): the stored answers are the engine's chat answers, and the training
    rows built from them start with the prompt ids the engine itself rendered."""
    from transformers import AutoTokenizer

    from training.records.chat_tokens import tokenize_rows

    out = tmp_path / "gen-chat"
    run_generate("--mix", str(mix), "--out", str(out), "--endpoint", target_server.url, "--model", "target",
                 "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--concurrency", "4")
    recs = records(out)
    assert recs and all(r["mode"] == "text" for r in recs)
    tokenizer = AutoTokenizer.from_pretrained(demo / "target")
    answers = 0
    for rec in recs:
        for k, message in enumerate(rec["messages"]):
            if not message.get("train"):
                continue
            answer = engine_chat(target_server, openai_messages(rec["messages"][:k]), rec.get("tools"))
            engine_message = answer["choices"][0]["message"]
            assert (message.get("content") or "") == (engine_message.get("content") or ""), (rec["id"], k)
            answers += 1
        # the row's prompt (the tokens before its first masked token) is the engine's prompt for the first answer
        first = next(k for k, m in enumerate(rec["messages"]) if m.get("train"))
        engine_prompt = engine_chat(target_server, openai_messages(rec["messages"][:first]), rec.get("tools"),
                                    max_tokens=1)["prompt_token_ids"]
        n = len(engine_prompt)
        assert any(row.input_ids[:n].tolist() == engine_prompt and not row.loss_mask[:n].any() and row.loss_mask[n]
                   for row in tokenize_rows(rec, tokenizer)), rec["id"]
    assert answers >= len(recs)


def test_sigkill_mid_run_resumes_with_every_id_once(target_server: VllmServer, demo: Path,
                                                    tmp_path: Path) -> None:
    """`curator generate` killed with SIGKILL while the real engine answers, then run again: every mix
    id exactly once, each a token record."""
    from curator.rows.schema import open_mix

    big = write_mix(tmp_path / "big", rows=12)
    ids = sorted(r.id for r in open_mix(big).rows())
    out = tmp_path / "gen"
    # the CLI's own run, with shards of 2 rows so that some are on disk when the kill lands
    script = ("import sys; from curator.generate import GenerateConfig, generate; "
              "generate(GenerateConfig.model_validate_json(sys.argv[1]))")
    config = {"mix": str(big), "out": str(out), "model": "target", "endpoints": [target_server.url], "engine": "vllm",
              "tokenizer": str(demo / "target"), "temperature": 0.0, "max_tokens": 48, "concurrency": 2,
              "shard_rows": 2}
    argv = [sys.executable, "-c", script, json.dumps(config)]
    env = dict(os.environ)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not list(out.glob("shard-*.jsonl")):
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = [r["id"] for r in records(out)]
    assert 0 < len(first) < len(ids), "kill landed outside the run"
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    got = [r["id"] for r in records(out)]
    assert sorted(got) == ids  # every id exactly once
    assert all(r["mode"] == "token" for r in records(out))
