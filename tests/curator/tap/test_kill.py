"""A tap writer killed with SIGKILL mid-write leaves only whole records (a torn last line at most,
which readers skip), and the next run starts a new file beside them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from curator.tap.record import Exchange
from curator.tap.writer import TapLog, TapWriter
from curator.traffic.scrub import scrub

WRITER = r"""
import json, sys, time
from curator.tap.record import Exchange
from curator.tap.writer import TapLog, TapWriter
from curator.traffic.scrub import scrub

log = TapLog(sys.argv[1], max_file_bytes=200_000, max_total_bytes=10_000_000)
writer = TapWriter(log, scrub=scrub, queue_size=100_000, batch=8).start()
body = json.dumps({"model": "t", "messages": [{"role": "user", "content": "x" * 3000}]}).encode()
answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "y" * 5000}, "finish_reason": "stop"}]}).encode()
print("ready", flush=True)
while True:
    writer.submit(Exchange("chat", body, 200, [answer], time=time.time()))
    time.sleep(0.0005)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigkill_mid_write_leaves_only_whole_records(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, cwd=Path(__file__).parents[3])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(1.0)
        # the scrub process, a child of the writer's thread
        children = [int(pid) for task in Path(f"/proc/{proc.pid}/task").iterdir() for pid in (task / "children").read_text().split()]
    finally:  # never left running, whatever failed above
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert children
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in children)  # the scrub process saw its socket close and left
    files = sorted(tmp_path.glob("tap-*.jsonl"))
    lines = [line for p in files for line in p.read_bytes().splitlines(keepends=True)]
    assert len(lines) >= 2
    for p in files[:-1]:
        assert all(json.loads(line)["complete"] for line in p.read_bytes().splitlines())  # rotated files are whole
    # the newest file may be empty: the kill came between its opening and its first line
    *whole, last = files[-1].read_bytes().splitlines(keepends=True) or [b"\n"]
    assert all(json.loads(line)["answer"]["content"] == "y" * 5000 for line in whole)
    if last.strip() and last.endswith(b"\n"):
        json.loads(last)  # whole; a torn last line (no newline) is the record in flight, skipped by readers
    # the next run writes a file of its own: the torn line stays last in the old one
    log = TapLog(tmp_path, max_file_bytes=200_000, max_total_bytes=10_000_000)
    writer = TapWriter(log, scrub=scrub).start()
    writer.submit(Exchange("chat", b'{"model": "t", "messages": [{"role": "user", "content": "hi"}]}', 200, [b"{}"], time=time.time()))
    writer.close()
    assert log.path is not None and log.path not in files and len(log.path.read_bytes().splitlines()) == 1


def test_sigterm_writes_what_is_queued_and_exits(engine, tmp_path: Path):
    import re

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "curator", "tap", "--engine", engine.url, "--out", str(tmp_path), "--port", "0",
                             "--stats-every", "0"], stderr=subprocess.PIPE, cwd=Path(__file__).parents[3],
                            env={**os.environ, "COLUMNS": "200"})
    try:
        assert proc.stderr is not None
        url = None
        for raw in proc.stderr:
            found = re.search(r"tap: (http://127\.0\.0\.1:\d+) ->", raw.decode())
            if found:
                url = found.group(1)
                break
        assert url is not None
        for n in range(5):
            httpx.post(url + "/v1/chat/completions", json={"model": "t", "messages": [{"role": "user", "content": f"hi {n}"}]}).raise_for_status()
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read().decode()
        assert proc.wait(30) == 0, rest
    finally:  # never left running, whatever failed above
        proc.kill()
        proc.wait()
    lines = [json.loads(line) for p in tmp_path.glob("tap-*.jsonl") for line in p.read_bytes().splitlines()]
    assert sorted(r["messages"][0]["content"] for r in lines) == [f"hi {n}" for n in range(5)]
    assert "recorded" in rest  # the summary
