"""Benchmark build-mix: 100K prompts of realistic lengths through read, normalise, dedup and write.

Makes two local sources (ShareGPT multi-turn chat in JSON Lines, instruction/response code
prompts in parquet) whose prompt lengths follow a log-normal fitted by eye to ShareGPT/UltraChat
user turns (median ~500 characters, long tail to ~30K), with 3% exact and 2% near duplicates
planted across them, then times `build_mix` with exact + MinHash near dedup at 0.85.

    taskset -c 0,1 python bench/mix_bench.py --rows 100000

Prints rows/s and the manifest totals as JSON. Goal: the 100K in under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from curator.mix import build_mix, recipe_from_dict


def _vocab(rng: np.random.Generator, size: int = 30_000) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(2, 10, size)
    return np.array(["".join(rng.choice(letters, n)) for n in lengths])


def _texts(rng: np.random.Generator, vocab: np.ndarray, n: int) -> list[str]:
    # Zipf-like word frequencies and log-normal lengths (in words; ~6 characters a word).
    words = np.clip(rng.lognormal(mean=4.4, sigma=1.0, size=n).astype(int), 3, 5000)
    ranks = np.minimum(rng.zipf(1.15, size=int(words.sum())) - 1, len(vocab) - 1)
    tokens = vocab[ranks]
    out, pos = [], 0
    for w in words:
        out.append(" ".join(tokens[pos : pos + w]))
        pos += w
    return out


def make_sources(folder: Path, rows: int, seed: int = 0) -> None:
    """Write chat.jsonl and code.parquet with `rows` prompts in all, duplicates planted."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(rng)
    texts = _texts(rng, vocab, rows)
    n_exact, n_near = int(rows * 0.03), int(rows * 0.02)
    donors = rng.integers(0, rows // 2, n_exact + n_near)
    for i, d in enumerate(donors[:n_exact]):
        texts[rows - 1 - i] = texts[d].upper()
    for i, d in enumerate(donors[n_exact:]):
        words = texts[d].split()
        words[len(words) // 2] = "edited"
        texts[rows - 1 - n_exact - i] = " ".join(words)
    half = rows // 2
    with (folder / "chat.jsonl").open("w") as fh:
        for i in range(half):
            turns = [{"from": "human", "value": texts[i]}, {"from": "gpt", "value": "answer " * 20}]
            if i % 3 == 0:
                turns += [{"from": "human", "value": "and then?"}, {"from": "gpt", "value": "more"}]
            fh.write(json.dumps({"id": str(i), "conversations": turns}) + "\n")
    pq.write_table(
        pa.table({"instruction": texts[half:], "response": ["def f():\n    return 1"] * (rows - half)}),
        folder / "code.parquet",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--near", type=float, default=0.85)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        make_sources(folder, args.rows)
        prep_s = time.perf_counter() - t0
        half = args.rows // 2
        recipe = recipe_from_dict(
            {
                "name": "bench",
                "sources": [
                    {"path": str(folder / "chat.jsonl"), "name": "chat", "samples": half},
                    {"path": str(folder / "code.parquet"), "name": "code", "samples": args.rows - half},
                ],
                "dedup": {"exact": True, "near": args.near},
            }
        )
        t0, c0 = time.perf_counter(), time.process_time()
        manifest = build_mix(recipe, folder / "mix")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    result = {
        "rows": args.rows,
        "cores": len(os.sched_getaffinity(0)),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),  # below wall_s when other processes share the cores
        "rows_per_s": round(args.rows / wall),
        "prep_s": round(prep_s, 2),
        "kept": manifest["total"]["kept"],
        "duplicates": manifest["duplicates"],
        "goal_met": wall < 60,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
