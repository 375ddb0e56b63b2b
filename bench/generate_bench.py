"""Benchmark of the generation client against a local OpenAI-compatible server.

1. Throughput: a server that answers at once; how many requests/s the client sustains
   (goal: at least 1,000 on 2 cores). Measured for the bare client (OpenAIBackend.complete,
   64 in flight) and for the whole `generate()` pipeline (mix read, turn policy, shards).
2. Saturation: a server with 200 ms latency and concurrency 64; the server's time-averaged
   number of requests in flight (goal: at least 95% of 64).

The server runs as its own process (tests/fakes/openai_server.py, stdlib only), so client and
server each have a core. Usage:  python bench/generate_bench.py [--seconds 8] [--rows 5000]
Each phase is bounded in time; the whole run takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from curator.generate import GenerateConfig, generate  # noqa: E402
from curator.engines.sampling import SamplingParams  # noqa: E402
from curator.generate.client import OpenAIBackend  # noqa: E402
from curator.mix.publish import write_tables  # noqa: E402
from curator.rows.schema import SCHEMA  # noqa: E402

SERVER = ROOT / "tests" / "fakes" / "openai_server.py"


class Server:
    """The fake server in a child process."""

    def __init__(self, latency: float) -> None:
        self.proc = subprocess.Popen([sys.executable, str(SERVER), "--latency", str(latency)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def stats(self) -> dict:
        with urllib.request.urlopen(self.url + "/_stats", timeout=10) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        req = urllib.request.Request(self.url + "/_reset", data=b"{}", method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def client_rate(server: Server, concurrency: int, seconds: float) -> dict:
    """Return requests/s of OpenAIBackend.complete with `concurrency` callers for `seconds`."""
    backend = OpenAIBackend([server.url], "target", SamplingParams(max_tokens=64), concurrency=concurrency)
    await backend.start()
    # The start-up check is one request; the server's counters should see only the run.
    await asyncio.to_thread(server.reset)
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Write a function that reverses a linked list."}]
    done = 0

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            done += 1
            await backend.complete(messages)

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    await asyncio.gather(*(caller() for _ in range(backend.workers)))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await backend.aclose()
    return {"requests": done, "wall_s": wall, "requests_per_s": done / wall, "client_cpu": cpu / wall}


def pipeline_rate(url: str, n_rows: int, concurrency: int) -> dict:
    """Return requests/s of the whole generate() run over a mix of `n_rows` one-turn rows."""
    with tempfile.TemporaryDirectory() as tmp:
        mix = Path(tmp) / "mix"
        rows = [{"id": f"b{i}", "source": "bench", "category": "chat", "turns": "last", "keep_responses": False,
                 "messages": [{"role": "user", "content": f"question number {i}: explain recursion"}]}
                for i in range(n_rows)]
        write_tables(mix, [pa.Table.from_pylist(rows, schema=SCHEMA)], "bench")
        stats = generate(GenerateConfig(mix=mix, out=Path(tmp) / "out", model="target", endpoints=[url],
                                        concurrency=concurrency, max_tokens=64))
        assert stats.done_total == n_rows, stats
        return {"rows": n_rows, "wall_s": stats.wall_s, "requests_per_s": stats.requests_per_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of the client and saturation runs")
    parser.add_argument("--rows", type=int, default=5000, help="mix rows for the generate() pipeline run")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}  python {sys.version.split()[0]}")

    fast = Server(latency=0.0)
    try:
        asyncio.run(client_rate(fast, args.concurrency, 1.0))  # warm-up
        cpu0 = fast.cpu_s()
        res = asyncio.run(client_rate(fast, args.concurrency, args.seconds))
        server_cpu = (fast.cpu_s() - cpu0) / res["wall_s"]
        # On a shared machine the wall-clock rate also counts time other processes took; the
        # client's own CPU time per request gives the rate one free core sustains.
        cpu_ms = res["client_cpu"] * res["wall_s"] / res["requests"] * 1000
        print(f"[instant server] client, concurrency {args.concurrency}: {res['requests_per_s']:,.0f} requests/s "
              f"({res['requests']:,} requests in {res['wall_s']:.2f} s; client {res['client_cpu']:.0%} of a core, "
              f"server {server_cpu:.0%})  goal >= 1,000: {'PASS' if res['requests_per_s'] >= 1000 else 'FAIL'}")
        print(f"[instant server] client CPU per request {cpu_ms:.3f} ms -> {1000 / cpu_ms:,.0f} requests/s "
              f"per free core; load average now {os.getloadavg()[0]:.1f}")
        pipe = pipeline_rate(fast.url, args.rows, args.concurrency)
        print(f"[instant server] generate() pipeline: {pipe['requests_per_s']:,.0f} requests/s "
              f"({pipe['rows']:,} rows in {pipe['wall_s']:.2f} s, shards written and resumable)")
    finally:
        fast.close()

    slow = Server(latency=0.2)
    try:
        res = asyncio.run(client_rate(slow, args.concurrency, args.seconds))
        stats = slow.stats()
        ratio = stats["avg_in_flight"] / args.concurrency
        ideal = args.concurrency / 0.2
        print(f"[200 ms server] concurrency {args.concurrency}: server saw avg in-flight {stats['avg_in_flight']:.2f} "
              f"({ratio:.1%} of {args.concurrency}), max {stats['max_in_flight']}; {res['requests_per_s']:,.0f} requests/s "
              f"(ideal {ideal:,.0f})  goal >= 95%: {'PASS' if ratio >= 0.95 else 'FAIL'}")
    finally:
        slow.close()


if __name__ == "__main__":
    main()
