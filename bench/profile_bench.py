"""Benchmark `curator profile`: rows/s over a synthetic request log, and whether the cost is linear.

Writes a labelled synthetic traffic sample (curator.traffic.synthetic: chat, code, reasoning and
agentic requests with tools, a fifth wrapped as `{"body": ...}`) as JSON Lines, then times
`build_profile` (read, normalise, classify, measure, hash the features, write nothing) on the
first fifth of it and on all of it. Linear cost shows as the same rows/s at both sizes. Also
times the read alone (iter_traffic), to say how much of the cost is the classifier and features.

    taskset -c 0,1 python bench/profile_bench.py --rows 100000

Prints one JSON object: rows, mean characters per request, seconds and rows/s per stage.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from curator.traffic.profile import build_profile
from curator.traffic.read import iter_traffic
from curator.traffic.synthetic import write_jsonl

SHARES = {"agentic": 0.25, "code": 0.35, "reasoning": 0.15, "chat": 0.25}


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


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
        read_s, n_read = _timed(lambda: sum(1 for _ in iter_traffic(full)))
        small_s, _ = _timed(lambda: build_profile(small))
        full_s, profile = _timed(lambda: build_profile(full))
    result = {
        "rows": args.rows,
        "mean_record_chars": round(chars, 1),
        "read_only": {"seconds": round(read_s, 2), "rows_per_s": round(n_read / read_s)},
        "profile_fifth": {"rows": args.rows // 5, "seconds": round(small_s, 2), "rows_per_s": round(args.rows / 5 / small_s)},
        "profile_all": {"seconds": round(full_s, 2), "rows_per_s": round(args.rows / full_s)},
        "shares": {k: round(v, 4) for k, v in profile.shares().items()},
        "truth": SHARES,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
