"""`curator generate` against servers that answer badly on purpose (tests/fakes/hostile_server.py):
every bad answer is one counted row error, nothing else is lost, no credential is recorded, and a
request is bounded in time and size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from curator.cli import main
from curator.generate import GenerateConfig, generate
from tests.fakes.hostile_server import HostileServer, Reply, chat_answer
from tests.fakes.openai_server import FakeOpenAIServer, write_mix

ROOT = Path(__file__).resolve().parents[3]


def two_turn_rows(*ids: str) -> list[dict]:
    return [{"id": i, "turns": "all", "messages": [{"role": "user", "content": f"{i} first"},
                                                   {"role": "user", "content": f"{i} second"}]} for i in ids]


def stored_ids(out: Path) -> set[str]:
    return {json.loads(line)["id"] for shard in out.glob("shard-*.jsonl") for line in shard.read_text().splitlines()}


def errors(out: Path) -> dict[str, dict]:
    path = out / "errors.jsonl"
    return {e["id"]: e for e in map(json.loads, path.read_text().splitlines())} if path.exists() else {}


def config(mix: Path, out: Path, url: str, **kw) -> GenerateConfig:
    kw.setdefault("retry_base_s", 0.01)
    kw.setdefault("max_attempts", 2)
    return GenerateConfig(mix=mix, out=out, model="target", endpoints=[url], concurrency=2, **kw)


def last_user(request: dict) -> str:
    return next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")


def test_a_lone_surrogate_sent_back_as_history_is_one_failed_row(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", two_turn_rows("a", "bad", "c"))
    out = tmp_path / "out"

    def script(request: dict) -> Reply:
        text = last_user(request)
        return Reply(chat_answer("half a pair \ud800" if text == "bad first" else f"re: {text}"))

    with HostileServer(script) as server:
        stats = generate(config(mix, out, server.url))
    assert stored_ids(out) == {"a", "c"}  # the others are kept
    assert stats.status == "partial" and stats.errors_total == 1
    bad = errors(out)["bad"]
    assert "not valid Unicode" in bad["error"] and bad["permanent"] is True


def test_an_answer_nested_too_deep_is_one_failed_row(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", two_turn_rows("a", "deep"))
    out = tmp_path / "out"
    nested = b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    def script(request: dict) -> Reply:
        return Reply(nested) if last_user(request).startswith("deep") else Reply(chat_answer("fine"))

    with HostileServer(script) as server:
        stats = generate(config(mix, out, server.url))
    assert stored_ids(out) == {"a"} and stats.errors_total == 1
    assert "nested too deep" in errors(out)["deep"]["error"]


@pytest.mark.parametrize("content", [5, {"text": "hi"}, ["hi"]])
def test_an_answer_whose_content_is_not_text_is_a_permanent_row_error_never_retried(
        tmp_path: Path, content: object) -> None:
    """`content: 5` was once an AttributeError retried 8 times as a temporary error (sweep 2026-12-04 item 9)."""
    mix = write_mix(tmp_path / "mix", two_turn_rows("a", "odd"))
    out = tmp_path / "out"
    asked: list[str] = []

    def script(request: dict) -> Reply:
        text = last_user(request)
        if not text.startswith("odd"):
            return Reply(chat_answer(f"re: {text}"))
        asked.append(text)
        body = json.loads(chat_answer("x"))
        body["choices"][0]["message"]["content"] = content
        return Reply(json.dumps(body).encode())

    with HostileServer(script) as server:
        stats = generate(config(mix, out, server.url, max_attempts=4))
    assert asked == ["odd first"]  # asked once: the same request gets the same answer
    assert stored_ids(out) == {"a"} and stats.errors_total == 1
    odd = errors(out)["odd"]
    assert odd["permanent"] is True and "content that is not text" in odd["error"]


def test_an_empty_content_is_a_valid_answer(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", two_turn_rows("a", "empty"))
    out = tmp_path / "out"

    def script(request: dict) -> Reply:
        text = last_user(request)
        return Reply(chat_answer("" if text.startswith("empty") else f"re: {text}"))

    with HostileServer(script) as server:
        stats = generate(config(mix, out, server.url))
    assert stored_ids(out) == {"a", "empty"} and stats.errors_total == 0


def test_a_link_planted_at_errors_jsonl_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """errors.jsonl was once appended through a planted link, outside --out (sweep 2026-12-04 item 4)."""
    mix = write_mix(tmp_path / "mix", two_turn_rows("a", "bad"))
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "errors.jsonl").symlink_to(outside / "err.jsonl")

    def script(request: dict) -> Reply:  # the start-up check and `a` are answered; `bad` fails for good
        text = last_user(request)
        return Reply(b"no", status=400) if text.startswith("bad") else Reply(chat_answer(f"re: {text}"))

    with HostileServer(script) as server:
        code = main(["generate", "--mix", str(mix), "--out", str(out), "--model", "target",
                     "--endpoint", server.url, "--catalog", str(tmp_path / "c.duckdb")])
    assert code == 1
    assert list(outside.iterdir()) == []
    assert (out / "errors.jsonl").is_symlink() and not list(out.glob("shard-*.jsonl"))


def test_request_timeout_bounds_a_server_that_sends_one_byte_at_a_time(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", [{"id": "slow", "turns": "last", "messages": [{"role": "user", "content": "hi"}]}])
    out = tmp_path / "out"
    # 300 bytes at a byte every 0.1 s: 30 s in all, never a gap as long as the timeout
    with HostileServer(lambda request: Reply(chat_answer("x" * 100), drip_s=0.1)) as server:
        start = time.monotonic()
        stats = generate(config(mix, out, server.url, request_timeout_s=0.8, max_attempts=1))
        took = time.monotonic() - start
    assert took < 8 and stats.errors_total == 1
    assert "timed out" in errors(out)["slow"]["error"]


@pytest.mark.parametrize("chunked", [False, True])
def test_an_answer_past_the_size_cap_is_refused_and_never_stored(tmp_path: Path, chunked: bool) -> None:
    mix = write_mix(tmp_path / "mix", [{"id": i, "turns": "last", "messages": [{"role": "user", "content": i}]}
                                       for i in ("small", "huge")])
    out = tmp_path / "out"

    def script(request: dict) -> Reply:
        size = 3 * 2**20 if last_user(request) == "huge" else 10
        return Reply(chat_answer("y" * size), chunked=chunked)

    with HostileServer(script) as server:
        stats = generate(config(mix, out, server.url, max_answer_bytes=2**20))
    assert stored_ids(out) == {"small"} and stats.errors_total == 1
    huge = errors(out)["huge"]
    assert "larger than 1,048,576 bytes" in huge["error"] and huge["permanent"] is True
    assert sum(p.stat().st_size for p in out.glob("shard-*.jsonl")) < 10_000


def test_url_credentials_and_keys_of_any_shape_are_never_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "plain-looking-key-42"  # neither Bearer- nor sk-shaped
    monkeypatch.setenv("OPENAI_API_KEY", key)
    mix = write_mix(tmp_path / "mix", [{"id": i, "turns": "last", "messages": [{"role": "user", "content": i}]}
                                       for i in ("ok", "echo")])
    out, cat = tmp_path / "out", tmp_path / "c.duckdb"

    def script(request: dict) -> Reply:
        if last_user(request) == "echo":  # a server that quotes the key it was given
            return Reply(json.dumps({"error": {"message": f"key {key} has no access"}}).encode(), status=403)
        return Reply(chat_answer("fine"))

    with HostileServer(script) as server:
        secret_url = server.url.replace("http://", "http://alice:s3cr3t-pw@") + "/v1"
        code = main(["generate", "--mix", str(mix), "--out", str(out), "--model", "target",
                     "--endpoint", secret_url, "--catalog", str(cat)])
    assert code == 0
    # the password still reached the server, as basic auth
    assert all(h.get("authorization", "").startswith("Basic ") or "authorization" not in h for h in server.seen_headers)
    assert any(h.get("authorization", "").startswith("Basic ") for h in server.seen_headers)
    console = capsys.readouterr()
    written = "".join(p.read_text() for p in out.iterdir() if p.is_file())
    with duckdb.connect(str(cat), read_only=True) as con:
        recorded = json.dumps(con.execute("SELECT * FROM generation_runs").fetchall(), default=str)
    for text in (written, recorded, console.out + console.err):
        assert "s3cr3t-pw" not in text and "alice" not in text and key not in text
    assert json.loads((out / "generation.json").read_text())["endpoints"] == [server.url]
    assert [r["endpoint"] for r in map(json.loads, next(out.glob("shard-*.jsonl")).read_text().splitlines())] == [server.url]
    assert "[REDACTED]" in errors(out)["echo"]["error"]


RUNNER = ("import sys; from curator.generate import GenerateConfig, generate; "
          "generate(GenerateConfig.model_validate_json(open(sys.argv[1]).read()))")


def test_sigterm_keeps_the_buffered_rows_and_says_interrupted(tmp_path: Path) -> None:
    n = 300
    mix = write_mix(tmp_path / "mix", [{"id": f"r{i:03d}", "turns": "last",
                                        "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(n)])
    out = tmp_path / "out"
    with FakeOpenAIServer(latency=0.02, record=False) as server:
        # shards only every 10 minutes: whatever is done when the signal comes is still in memory
        cfg = GenerateConfig(mix=mix, out=out, model="target", endpoints=[server.url], concurrency=4,
                             shard_seconds=600, shard_rows=10_000)
        (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path / "cfg.json")], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while server.stats()["chat_requests"] < 30:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
            assert not list(out.glob("shard-*.jsonl"))
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
    assert proc.returncode != -signal.SIGTERM  # handled, not killed by it
    kept = stored_ids(out)
    assert 20 <= len(kept) < n
    assert json.loads((out / "generation.json").read_text())["status"] == "interrupted"


# ---------------------------------------------------------------- token ids out of range

from tests.fakes.token_servers import FakeSGLangServer, FakeVLLMServer  # noqa: E402
from tests.training.records.test_chat_templates import tokenizer  # noqa: E402
from tests.training.records.test_token_exact import run, tok_dir, weather_policy  # noqa: E402,F401 (tok_dir: a fixture)

WILD_IDS = {"negative": -1, "huge": 2**70, "past": None}  # None: just past the tokenizer


@pytest.mark.parametrize("server_cls", [FakeSGLangServer, FakeVLLMServer])
def test_output_ids_out_of_range_are_one_failed_row_each_never_stored(
    tmp_path: Path, tok_dir: Path, server_cls: type
) -> None:
    class WildIds(server_cls):  # type: ignore[misc, valid-type]
        def generate(self, prompt_ids: list[int]) -> tuple[str, list[int], int]:
            text, ids, end = super().generate(prompt_ids)
            prompt = self.tokenizer.decode(prompt_ids)
            for marker, wild in WILD_IDS.items():
                if marker in prompt:
                    ids = [*ids[:-1], len(self.tokenizer) if wild is None else wild, ids[-1]]
            return text, ids, end

    rows = [{"id": m, "messages": [{"role": "user", "content": f"{m} please"}]} for m in [*WILD_IDS, "plain"]]
    with WildIds(tokenizer("qwen3"), weather_policy) as server:
        recs, errs = run(tmp_path, server, tok_dir, rows)
    assert set(recs) == {"plain"}
    assert {e["id"] for e in errs} == set(WILD_IDS)
    assert all("outside the tokenizer" in e["error"] and e["permanent"] for e in errs)
