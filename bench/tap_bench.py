"""Benchmark `curator tap`: the proxy against the engine directly, and the writer on long requests.

1. Serving (`--model DIR` starts a vLLM server on it, or `--engine URL` uses a running one): the
   tap runs as `curator tap` (its own process, recording every request) in front of the engine,
   and the same requests go to the engine directly and through the tap in alternating rounds, so
   drift of a shared machine falls on both alike. Per concurrency (1 and 32 by default): requests/s
   of non-streamed chat requests with short answers (ignore_eos, a fixed number of tokens), as a
   ratio through/direct per pair of rounds (goal: 0.98 or more). Streamed: the time to the first
   token (the first event carrying a token) at concurrency 1, through minus direct (goal: 5 ms
   or less). With `--model`, CPU seconds per request of the engine (server and engine core), the
   tap and its scrub process: on a shared machine the steadier figure, and where the CPU limits
   throughput, `cpu_bound_ratio` (engine CPU direct / everything's CPU through the tap) is the
   ratio the wall clock would show without other jobs.
2. Writer (`--writer`): records/s of the tap's writer on 20 KB chat requests (slices of the
   project's docs, an answer of 2 KB), every record scrubbed, with the record made on the writer's
   thread (`processes=0`, as the first version did) and in the scrub process (the default); and
   the time the tap's event loop is held up meanwhile (the longest stall of a 1 ms timer). Also a
   20 KB token-like text (base64), the scrubber's worst case.

    python bench/tap_bench.py --model /tmp/demo/target --writer
    python bench/tap_bench.py --engine http://127.0.0.1:8000

Prints one JSON object per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from curator.engines.local_vllm import cpu_env, free_port, server_argv, stop_group, vllm_python, wait_healthy  # noqa: E402
from curator.tap.record import Exchange  # noqa: E402
from curator.tap.writer import TapLog, TapWriter  # noqa: E402
from curator.traffic.scrub import scrub  # noqa: E402

CHAT = "/v1/chat/completions"
TOPICS = ["a list comprehension", "a binary search", "the GIL", "a hash map", "a context manager", "recursion",
          "a generator", "unit tests", "a regular expression", "a deadlock", "a linked list", "memoisation"]


# ---------------------------------------------------------------- the engine and the tap as processes

def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of one process so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """The process's children, theirs, and so on."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid, *descendants(kid)]
    return out


class Engine:
    """vLLM on `model`, 127.0.0.1, enough sequences for the highest concurrency."""

    def __init__(self, model: str, max_num_seqs: int, log: Path) -> None:
        python = vllm_python()
        if python is None:
            raise SystemExit("no vLLM python: set CURATOR_VLLM_PYTHON (bash .ci/vllm.sh)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = server_argv(python, model, self.port, max_num_seqs=max_num_seqs, max_model_len=512)
        env = {k: v for k, v in cpu_env(VLLM_TARGET_DEVICE="cpu").items() if not k.startswith("CUDA_")}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        why = wait_healthy(self.proc, self.url, 900)
        if why is not None:
            stop_group(self.proc)
            raise SystemExit(f"{why}; log: {log}")

    def cpu_s(self) -> float:
        """CPU seconds so far of the server and its engine-core process."""
        return proc_cpu_s(self.proc.pid) + sum(proc_cpu_s(k) for k in descendants(self.proc.pid))

    def stop(self) -> None:
        stop_group(self.proc)


class Tap:
    """`curator tap` in front of `engine`, recording every chat request into `out`."""

    def __init__(self, engine: str, out: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "curator", "tap", "--engine", engine, "--out", str(out),
                                      "--port", "0", "--stats-every", "0"],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=ROOT,
                                     env={**os.environ, "COLUMNS": "200"})
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            found = re.search(r"tap: (http://[\d.]+:\d+) ->", raw.decode(errors="replace"))
            if found:
                self.url = found.group(1)
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep its pipe drained
                return
        raise SystemExit("curator tap did not start")

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/tap/stats", timeout=10).json()

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far of the tap's own process and of its scrub process."""
        return proc_cpu_s(self.proc.pid), sum(proc_cpu_s(k) for k in descendants(self.proc.pid))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


# ---------------------------------------------------------------- one round of requests

def body(i: int, *, stream: bool, tokens: int) -> dict[str, Any]:
    return {"model": "target", "messages": [{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} (question {i})."}],
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0, "stream": stream, "return_token_ids": True}


async def throughput_round(client: httpx.AsyncClient, url: str, n: int, concurrency: int, tokens: int) -> float:
    """Requests/s of `n` non-streamed requests, `concurrency` in flight."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            r = await client.post(url + CHAT, json=body(i, stream=False, tokens=tokens))
            r.raise_for_status()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - start)


async def first_token_round(client: httpx.AsyncClient, url: str, n: int, tokens: int) -> list[float]:
    """Seconds to the first event carrying a token, one streamed request at a time."""
    out = []
    for i in range(n):
        start = time.perf_counter()
        async with client.stream("POST", url + CHAT, json=body(i, stream=True, tokens=tokens)) as r:
            seen = b""
            first = None
            async for chunk in r.aiter_raw():
                seen += chunk
                if first is None and b'"token_ids":[' in seen:
                    first = time.perf_counter() - start
            assert first is not None, seen[:300]
        out.append(first)
    return out


async def serving(engine: str, tap: Tap, args: argparse.Namespace, engine_cpu: Callable[[], float] | None) -> dict[str, Any]:
    result: dict[str, Any] = {"pairs": args.pairs}
    limits = httpx.Limits(max_connections=max(args.concurrency) * 2, max_keepalive_connections=max(args.concurrency) * 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        for url in (engine, tap.url):  # warm both paths (connections, the engine's caches)
            await throughput_round(client, url, 8, 4, args.tokens)
            await first_token_round(client, url, 2, 4)
        for concurrency in args.concurrency:
            n = args.requests_per_worker * concurrency
            direct: list[float] = []
            through: list[float] = []
            cpu = {"direct": 0.0, "tap": 0.0, "tap_process": 0.0, "scrub_process": 0.0}
            for pair in range(args.pairs):
                order = [(engine, direct), (tap.url, through)]
                for url, into in order if pair % 2 == 0 else order[::-1]:  # who goes first alternates
                    before, tap_before = (engine_cpu() if engine_cpu else 0.0), tap.cpu_s()
                    into.append(await throughput_round(client, url, n, concurrency, args.tokens))
                    after, tap_after = (engine_cpu() if engine_cpu else 0.0), tap.cpu_s()
                    cpu["direct" if url == engine else "tap"] += after - before
                    if url != engine:
                        cpu["tap_process"] += tap_after[0] - tap_before[0]
                        cpu["scrub_process"] += tap_after[1] - tap_before[1]
            ratios = [t / d for t, d in zip(through, direct)]
            per = {k: v * 1000 / (n * args.pairs) for k, v in cpu.items()}
            row: dict[str, Any] = {
                "requests_per_round": n, "tokens_per_answer": args.tokens,
                "direct_req_s": [round(x, 2) for x in direct], "tap_req_s": [round(x, 2) for x in through],
                "ratio_median": round(statistics.median(ratios), 4), "ratio_of_sums": round(sum(through) / sum(direct), 4),
                "ratios": [round(x, 3) for x in ratios],
                "tap_cpu_ms_per_request": round(per["tap_process"], 3), "scrub_cpu_ms_per_request": round(per["scrub_process"], 3)}
            if engine_cpu:
                # where the CPU is what limits (this machine at concurrency 32), throughput goes as 1 / CPU per request
                row.update(engine_cpu_ms_per_request_direct=round(per["direct"], 2), engine_cpu_ms_per_request_tap=round(per["tap"], 2),
                           cpu_bound_ratio=round(per["direct"] / (per["tap"] + per["tap_process"] + per["scrub_process"]), 4))
            result[f"c{concurrency}"] = row
        direct_ft: list[float] = []
        through_ft: list[float] = []
        for pair in range(args.pairs):
            order = [(engine, direct_ft), (tap.url, through_ft)]
            for url, into in order if pair % 2 == 0 else order[::-1]:
                into.extend(await first_token_round(client, url, args.first_token_requests, 4))
        result["first_token"] = {
            "requests": len(direct_ft), "direct_median_ms": round(statistics.median(direct_ft) * 1000, 2),
            "tap_median_ms": round(statistics.median(through_ft) * 1000, 2),
            "added_median_ms": round((statistics.median(through_ft) - statistics.median(direct_ft)) * 1000, 2),
            "direct_mean_ms": round(statistics.mean(direct_ft) * 1000, 2), "tap_mean_ms": round(statistics.mean(through_ft) * 1000, 2)}
    stats = tap.stats()
    result["tap"] = {k: stats.get(k, 0) for k in ("requests", "recorded", "dropped_queue_full", "dropped_scrub_timeout",
                                                 "incomplete", "record_errors")}
    return result


# ---------------------------------------------------------------- the writer alone

def docs_text() -> str:
    return "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def exchanges(n: int, size: int, text: str) -> list[Exchange]:
    """`n` chat exchanges with a `size`-character user message (distinct slices of `text`) and a 2 KB answer."""
    out = []
    for i in range(n):
        start = (i * 7919) % max(1, len(text) - size)
        content = (text[start:start + size] + f" (request {i})")
        request = json.dumps({"model": "target", "messages": [{"role": "user", "content": content}], "max_tokens": 512}).encode()
        answer = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text[start + size:start + size + 2000]},
                                          "finish_reason": "stop", "token_ids": list(range(500))}],
                             "prompt_token_ids": list(range(5000)), "usage": {"prompt_tokens": 5000, "completion_tokens": 500}}).encode()
        out.append(Exchange("chat", request, 200, [answer], time=time.time()))
    return out


def stall_probe(stop: threading.Event, out: list[float]) -> None:
    """The longest delay of a 1 ms timer on an event loop in this process: what the writer costs the proxy's loop."""
    async def probe() -> None:
        worst = 0.0
        while not stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - start - 0.001)
        out.append(worst)

    asyncio.run(probe())


def writer_rate(items: list[Exchange], processes: int, folder: Path) -> dict[str, Any]:
    log = TapLog(folder, max_file_bytes=1 << 30, max_total_bytes=1 << 32)
    folder.mkdir(parents=True, exist_ok=True)
    writer = TapWriter(log, scrub=scrub, queue_size=len(items) + 1, processes=processes, limit_s=60.0).start()
    if processes:  # the scrub process's start-up is not the rate
        writer.submit(items[0])
        while writer.snapshot().get("recorded", 0) < 1:
            time.sleep(0.01)
    stop, worst = threading.Event(), list[float]()
    probe = threading.Thread(target=stall_probe, args=(stop, worst))
    probe.start()
    time.sleep(0.2)
    start = time.perf_counter()
    for item in items:
        writer.submit(item)
    goal = len(items) + (1 if processes else 0)
    while sum(writer.snapshot().get(k, 0) for k in ("recorded", "record_errors", "dropped_scrub_timeout", "unreadable")) < goal:
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    stop.set()
    probe.join()
    writer.close()
    s = writer.snapshot()
    return {"processes": processes, "records": len(items), "records_s": round(len(items) / elapsed, 1),
            "event_loop_worst_stall_ms": round(worst[0] * 1000, 1), "recorded": s.get("recorded", 0),
            "dropped": s.get("dropped_queue_full", 0) + s.get("dropped_scrub_timeout", 0)}


def writer_phase(args: argparse.Namespace) -> dict[str, Any]:
    text = docs_text()
    items = exchanges(args.writer_records, 20_000, text)
    # distinct texts: the scrub process would otherwise answer the repeats from its memo
    token_like = [Exchange("chat", json.dumps({"model": "t", "messages": [{"role": "user", "content": f"{i}" + "aGVsbG8gd29ybGQ" * 1334}]}).encode(),
                           200, [b'{"choices": []}'], time=time.time()) for i in range(4)]
    out: dict[str, Any] = {"request_chars": 20_000}
    with tempfile.TemporaryDirectory() as tmp:
        for processes in (0, 1):
            out[f"processes={processes}"] = writer_rate(items, processes, Path(tmp) / f"p{processes}")
            out[f"token_like processes={processes}"] = writer_rate(token_like, processes, Path(tmp) / f"t{processes}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model folder: vLLM is started on it")
    parser.add_argument("--engine", help="a running engine's address instead of --model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--pairs", type=int, default=6, help="rounds through the tap, each beside a direct one")
    parser.add_argument("--requests-per-worker", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (ignore_eos)")
    parser.add_argument("--first-token-requests", type=int, default=8, help="streamed requests per round")
    parser.add_argument("--writer", action="store_true", help="also the writer alone on 20 KB requests")
    parser.add_argument("--writer-records", type=int, default=200)
    parser.add_argument("--only-writer", action="store_true")
    args = parser.parse_args()
    if args.writer or args.only_writer:
        print(json.dumps({"writer": writer_phase(args)}), flush=True)
    if args.only_writer:
        return
    if not (args.model or args.engine):
        parser.error("--model or --engine")
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(args.model, max(args.concurrency), Path(tmp) / "vllm.log") if args.model else None
        url = engine.url if engine else args.engine.rstrip("/")
        tap = Tap(url, Path(tmp) / "tapped")
        try:
            print(json.dumps({"serving": asyncio.run(serving(url, tap, args, engine.cpu_s if engine else None))}), flush=True)
        finally:
            tap.stop()
            if engine:
                engine.stop()


if __name__ == "__main__":
    main()
