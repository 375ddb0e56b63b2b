"""Benchmark `curator profile`: rows/s over a synthetic request log, and whether the cost is linear.

Writes a labelled synthetic traffic sample (curator.traffic.synthetic: chat, code, reasoning and
agentic requests with tools, a fifth wrapped as `{"body": ...}`) as JSON Lines, then times
`build_profile` (read, normalise, classify, measure, hash the features, write nothing) on the
first fifth of it and on all of it. Linear cost shows as the same rows/s at both sizes. Also
times the read alone (iter_traffic), to say how much of the cost is the classifier and features.

    taskset -c 0,1 python bench/profile_bench.py --rows 100000

Prints one JSON object: mean characters per record, then per stage rows, wall seconds and rows/s,
and the process's CPU seconds and rows per CPU second (steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from curator.traffic.profile import build_profile
from curator.traffic.read import iter_traffic
from curator.traffic.synthetic import write_jsonl

T = TypeVar("T")
SHARES = {"agentic": 0.25, "code": 0.35, "reasoning": 0.15, "chat": 0.25}


def timed(fn: Callable[[], T]) -> tuple[float, float, T]:
    """Return (wall seconds, CPU seconds of this process, result): on a shared machine the CPU time is the steadier."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


def _stage(rows: int, wall: float, cpu: float) -> dict[str, float]:
    return {"rows": rows, "seconds": round(wall, 2), "rows_per_s": round(rows / wall),
            "cpu_seconds": round(cpu, 2), "rows_per_cpu_s": round(rows / cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small, full = Path(tmp) / "small.jsonl", Path(tmp) / "full.jsonl"
        write_jsonl(full, args.rows, SHARES, seed=args.seed)
        lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
        small.write_text("".join(lines[: args.rows // 5]), encoding="utf-8")
        chars = sum(len(line) for line in lines) / len(lines)
        read_s, read_cpu, n_read = timed(lambda: sum(1 for _ in iter_traffic(full)))
        small_s, small_cpu, _ = timed(lambda: build_profile(small))
        full_s, full_cpu, profile = timed(lambda: build_profile(full))
    result = {
        "mean_record_chars": round(chars, 1),
        "read_only": _stage(n_read, read_s, read_cpu),
        "profile_fifth": _stage(args.rows // 5, small_s, small_cpu),
        "profile_all": _stage(args.rows, full_s, full_cpu),
        "shares": {k: round(v, 4) for k, v in profile.shares().items()},
        "truth": SHARES,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
