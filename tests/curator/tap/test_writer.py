"""The writer makes records in a process of its own: a slow scrub never holds up the proxy, a record
that takes too long is given up (counted, never written unscrubbed), and texts seen before are not
scrubbed again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from curator.tap.maker import MEMO_MIN_CHARS, Memo
from curator.tap.proxy import TapProxy
from curator.tap.record import Exchange
from curator.tap.writer import TapLog, TapWriter
from curator.traffic.scrub import scrub
from tests.curator.tap.conftest import RunningTap, records

SLOW = "SLOW-SCRUB"
STUCK = "STUCK-SCRUB"


def gil_scrub(text: str) -> str:
    """The scrubber, but a text with SLOW in it also runs a regular expression that backtracks
    quadratically over 20,000 characters (the shape of the e-mail pattern on a long token): about a
    second in `re`, which holds the GIL throughout."""
    if SLOW in text:
        re.search(r"\w+@", "a" * 20_000)
    return scrub(text)


def stuck_scrub(text: str) -> str:
    if STUCK in text:
        time.sleep(60)
    return scrub(text)


def _chat(content: str) -> dict[str, object]:
    return {"model": "target", "messages": [{"role": "user", "content": content}]}


def test_a_slow_scrub_never_holds_up_requests(engine, tmp_path: Path):
    log = TapLog(tmp_path / "tap", max_file_bytes=1 << 20, max_total_bytes=1 << 22)
    log.folder.mkdir(parents=True)
    writer = TapWriter(log, scrub=gil_scrub).start()
    tap = RunningTap(TapProxy(engine.url, writer), writer).start()
    try:
        with httpx.Client() as client:
            client.post(tap.url + "/v1/chat/completions", json=_chat("warm up")).raise_for_status()
            tap.flush(1)  # the scrub process is up
            for n in range(3):
                client.post(tap.url + "/v1/chat/completions", json=_chat(f"{SLOW} {n}")).raise_for_status()
            start = time.monotonic()
            for _ in range(10):  # while the writer scrubs for seconds
                client.get(tap.url + "/v1/models").raise_for_status()
            quick = time.monotonic() - start
            assert writer.snapshot().get("recorded", 0) < 4  # the slow scrubs were still going on meanwhile
        assert quick < 0.5, f"10 requests took {quick:.2f} s while the writer scrubbed"
        tap.flush(4, timeout=30)
        assert writer.snapshot()["recorded"] == 4
    finally:
        tap.stop()


def test_a_record_past_its_time_limit_is_given_up_and_the_next_recorded(tmp_path: Path):
    log = TapLog(tmp_path, max_file_bytes=1 << 20, max_total_bytes=1 << 22)
    writer = TapWriter(log, scrub=stuck_scrub, limit_s=1.0).start()
    answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}).encode()
    for content in (f"{STUCK} mail jane.doe@example.com", "after the stuck one"):
        writer.submit(Exchange("chat", json.dumps(_chat(content)).encode(), 200, [answer], time=time.time()))
    deadline = time.monotonic() + 30
    while writer.snapshot().get("recorded", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    writer.close()
    stats = writer.snapshot()
    assert stats["dropped_scrub_timeout"] == 1 and stats["recorded"] == 1 and "over 1.0 s" in stats["last_error"]
    assert [r["messages"][0]["content"] for r in records(tmp_path)] == ["after the stuck one"]
    assert b"jane.doe" not in b"".join(p.read_bytes() for p in tmp_path.iterdir())


def test_a_text_seen_before_is_not_scrubbed_again():
    calls: list[str] = []

    def counting(text: str) -> str:
        calls.append(text)
        return scrub(text)

    memo = Memo(counting, max_chars=4 * MEMO_MIN_CHARS * 2)
    history = "The system prompt of an agent, sent again with every turn: jane@example.com. " * 2
    assert memo(history) == scrub(history) and memo(history) == scrub(history)
    assert calls == [history] and memo.hits == 1
    memo("hi")
    memo("hi")
    assert calls.count("hi") == 2  # short texts are not kept
    for n in range(4):  # past its bound the oldest text goes first
        memo(f"{n} " * MEMO_MIN_CHARS)
    assert memo.chars <= memo.max_chars
    memo(history)
    assert calls.count(history) == 2


def test_records_made_on_the_writer_thread_when_asked(tmp_path: Path):
    log = TapLog(tmp_path, max_file_bytes=1 << 20, max_total_bytes=1 << 22)
    writer = TapWriter(log, scrub=scrub, processes=0, caps={"chat": 1}).start()
    for content in ("hello there", "how are you", "mail me at jane.doe@example.com"):
        writer.submit(Exchange("chat", json.dumps(_chat(content)).encode(), 200, [b"{}"], time=time.time()))
    writer.close()
    assert [r["messages"][0]["content"] for r in records(tmp_path)] == ["hello there"]
    assert writer.snapshot()["dropped_cap"] == 2


SCRIPT = """
import json, os, sys, time
from curator.tap.record import Exchange
from curator.tap.writer import TapLog, TapWriter
from curator.traffic.scrub import scrub

# no `if __name__ == "__main__"`: the scrub process must not run this script again
os.makedirs(sys.argv[1])
writer = TapWriter(TapLog(sys.argv[1], max_file_bytes=1 << 20, max_total_bytes=1 << 22), scrub=scrub).start()
body = json.dumps({"model": "t", "messages": [{"role": "user", "content": "hello"}]}).encode()
writer.submit(Exchange("chat", body, 200, [b"{}"], time=time.time()))
writer.close()
print(json.dumps(writer.snapshot()))
"""


def test_a_writer_in_a_plain_script_records(tmp_path: Path):
    script = tmp_path / "embed.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "tap")], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["recorded"] == 1 and done.stderr == ""
