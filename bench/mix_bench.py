"""Benchmark build-mix: 100K prompts of realistic lengths through read, normalise, dedup and write.

Makes two local sources (ShareGPT multi-turn chat in JSON Lines, instruction/response code
prompts in parquet) whose prompt lengths follow a log-normal fitted by eye to ShareGPT/UltraChat
user turns (median ~500 characters, long tail to ~30K), with 3% exact and 2% near duplicates
planted across them (each near copy edited until its word 5-gram Jaccard with its donor lies in
[near, near + 0.05]), then times `build_mix` with exact + MinHash near dedup at 0.85.

Near-dedup quality is measured on the same texts by a `Deduper` pass in file order: recall is
the share of planted pairs whose copy is caught, precision the share of near matches whose true
5-gram Jaccard (computed here on Python sets) reaches the threshold.

In the same run the same recipe is built again with `match=` a traffic profile (categories chat
and code at the recipe's own shares, features from 5,000 other texts of the same generator), so
the two times differ only by what --match adds: one more pass over every source (normalise,
hash features), the importance weights and the Gumbel keys.

    taskset -c 0,1 python bench/mix_bench.py --rows 100000

Prints rows/s, precision, recall and the manifest totals as JSON. Goals: the 100K in under 60 s
on 2 cores; recall >= 0.99 at the threshold; --match adds no more than 50% to the build's time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from curator.mix import build_mix, recipe_from_dict
from curator.mix.dedup import Deduper
from curator.rows.shingles import normalise_text
from curator.traffic.features import BUCKETS, FEATURE_METHOD, distribution
from curator.traffic.profile import write_profile as save_profile
from curator.traffic.schema import CategoryShare, Features, Profile, SparseCounts

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.profile_bench import timed  # noqa: E402


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


def shingles(text: str) -> set[tuple[str, ...]]:
    """Return the word 5-grams of normalised text (a shorter text is one shingle), as dedup defines them."""
    words = normalise_text(text).split()
    return {tuple(words[i : i + 5]) for i in range(max(1, len(words) - 4))}


def jaccard(a: set, b: set) -> float:
    """Return |a & b| / |a | b|."""
    return len(a & b) / len(a | b) if a or b else 1.0


def _near_copy(rng: np.random.Generator, text: str, low: float, high: float) -> str | None:
    """Return `text` with words replaced until its 5-gram Jaccard with `text` is in [low, high] (None if it cannot)."""
    original = shingles(text)
    for _ in range(20):
        words = text.split()
        while (j := jaccard(original, shingles(" ".join(words)))) > high:
            words[int(rng.integers(len(words)))] = f"edit{int(rng.integers(1 << 40))}"
        if j >= low:
            return " ".join(words)
    return None


def make_sources(folder: Path, rows: int, near: float, seed: int = 0) -> tuple[list[str], list[tuple[int, int]]]:
    """Write chat.jsonl and code.parquet with `rows` prompts in all, duplicates planted; return
    the texts in file order and the planted near pairs (donor, copy) by position."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(rng)
    texts = _texts(rng, vocab, rows)
    n_exact, n_near = int(rows * 0.03), int(rows * 0.02)
    donors = rng.integers(0, rows // 2, n_exact)
    for i, d in enumerate(donors):
        texts[rows - 1 - i] = texts[d].upper()
    # Near donors need 40+ words: a short text has too few 5-grams to land in a narrow Jaccard band.
    long_enough = np.flatnonzero(np.array([t.count(" ") >= 40 for t in texts[: rows // 2]]))
    pairs = []
    for i, d in enumerate(rng.choice(long_enough, n_near, replace=False)):
        copy = _near_copy(rng, texts[d], near, min(1.0, near + 0.05))
        if copy is not None:
            texts[rows - 1 - n_exact - i] = copy
            pairs.append((int(d), rows - 1 - n_exact - i))
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
    return texts, pairs


def near_quality(texts: list[str], pairs: list[tuple[int, int]], near: float) -> dict[str, float]:
    """Return recall over the planted pairs and precision over every near match, of a Deduper pass in file order."""
    dedup = Deduper(exact=True, near=near)
    remembered: list[int] = []  # text index of each row the deduper remembers (its `Match.row`)
    found: dict[int, int] = {}  # copy -> matched text
    t0 = time.perf_counter()
    for start in range(0, len(texts), 512):
        batch = list(range(start, min(start + 512, len(texts))))
        for i, item in zip(batch, dedup.prepare([texts[i] for i in batch])):
            match = dedup.check(item, 0)
            if match is None and item.signature is not None:
                remembered.append(i)
            elif match is not None and match.kind == "near":
                found[i] = remembered[match.row]
    wall = time.perf_counter() - t0
    true = sum(jaccard(shingles(texts[i]), shingles(texts[j])) >= near for i, j in found.items())
    caught = sum(copy in found for _, copy in pairs)
    return {"planted_pairs": len(pairs), "recall": round(caught / max(1, len(pairs)), 4),
            "near_matches": len(found), "precision": round(true / max(1, len(found)), 4), "dedup_pass_s": round(wall, 2)}


def write_profile(path: Path, shares: dict[str, float], seed: int = 1) -> Path:
    """Write a traffic profile whose per-category features come from 5,000 fresh texts each."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(np.random.default_rng(0))  # the sources' vocabulary, other texts
    per_category = {}
    for cat in shares:
        dense = distribution(_texts(rng, vocab, 5000))
        nz = np.flatnonzero(dense)
        per_category[cat] = SparseCounts(indices=nz.tolist(), counts=dense[nz].tolist())
    profile = Profile(categories={c: CategoryShare(share=s, rows=5000) for c, s in shares.items()},
                      features=Features(method=FEATURE_METHOD, buckets=BUCKETS, per_category=per_category))
    return save_profile(profile, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--near", type=float, default=0.85)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        texts, pairs = make_sources(folder, args.rows, args.near)
        prep_s = time.perf_counter() - t0
        half = args.rows // 2
        recipe = recipe_from_dict(
            {
                "name": "bench",
                "sources": [
                    {"path": str(folder / "chat.jsonl"), "name": "chat", "samples": half, "category": "chat"},
                    {"path": str(folder / "code.parquet"), "name": "code", "samples": args.rows - half, "category": "code"},
                ],
                "dedup": {"exact": True, "near": args.near},
            }
        )
        profile = write_profile(folder / "profile.json", {"chat": half / args.rows, "code": 1 - half / args.rows})
        wall, cpu, manifest = timed(lambda: build_mix(recipe, folder / "mix"))
        m_wall, m_cpu, matched = timed(lambda: build_mix(recipe, folder / "matched", match=profile))
    quality = near_quality(texts, pairs, args.near)
    result = {
        "rows": args.rows,
        "cores": len(os.sched_getaffinity(0)),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),  # below wall_s when other processes share the cores
        "rows_per_s": round(args.rows / wall),
        "s_per_100k_rows": round(wall * 100_000 / args.rows, 2),
        **quality,
        "prep_s": round(prep_s, 2),
        "kept": manifest["total"]["kept"],
        "duplicates": manifest["duplicates"],
        "goal_met": wall < 60,
        "match": {
            "wall_s": round(m_wall, 2),
            "cpu_s": round(m_cpu, 2),
            "rows_per_s": round(args.rows / m_wall),
            "added": round(m_wall / wall - 1, 3),  # the share --match adds to the build's time
            "kept": matched["total"]["kept"],
            "method": matched["match"]["method"],
            "goal_met": m_wall <= 1.5 * wall,
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
