"""The curation stages of the multi-domain reference, each through the toolkit's own code:
`curator profile` on the traffic, `build-mix` (with and without `--match`) on the pool.

The pool is what a public mix offers: one source per category, the code source mixing Python
with other languages' code and configuration files, as a public code set mixes languages. The
four mixes of the comparison differ only in what `--match` is given:

    generic    no profile: the recipe's quotas, uniform over the six domains; rows drawn at random
    both       the traffic's profile: its category shares, and traffic-like rows inside a category
    quotas     the profile without its features: its shares, rows drawn at random
               (build-mix's documented behaviour for a profile without features)
    selection  the profile with the generic mix's shares: the recipe's quotas, traffic-like rows
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bench.reference_multidomain.domains import CATEGORY, DOMAINS
from training.io.atomic import write_text

POOL_SOURCES = {cat: [d for d in DOMAINS if CATEGORY[d] == cat] for cat in dict.fromkeys(CATEGORY.values())}


def profile(traffic: Path, out: Path) -> Any:
    """Profile the traffic as `curator profile --traffic FILE --out PROFILE.json` does (its library
    calls, without the console: the GPU image's typer cannot render this CLI's help types); return
    the profile it wrote."""
    from curator.traffic.profile import build_profile, write_profile
    from curator.traffic.schema import load_profile

    write_profile(build_profile(traffic), out)
    return load_profile(out)


def pool_sources(rows_by_domain: dict[str, list[dict[str, Any]]], folder: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Write one JSONL source per category (the code source interleaves its domains' rows); return
    the files and each row's domain by the id build-mix will give it ("<category>:<row index>")."""
    folder.mkdir(parents=True, exist_ok=True)
    files, domain_of = {}, {}
    for cat, domains in POOL_SOURCES.items():
        rows: list[tuple[str, dict[str, Any]]] = []
        queues = [[(d, r) for r in rows_by_domain[d]] for d in domains]
        while any(queues):  # interleaved, so no domain sits at the top of the file
            for q in queues:
                if q:
                    rows.append(q.pop(0))
        files[cat] = write_text(folder / f"{cat}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for _, r in rows))
        domain_of.update({f"{cat}:{i}": d for i, (d, _) in enumerate(rows)})
    return files, domain_of


def _recipe(files: dict[str, Path], root: Path, name: str, total: int, decontaminate: Path,
            shares: dict[str, float] | None = None) -> dict[str, Any]:
    """Return a recipe whose quotas are uniform over the six domains (a category gets its domains'
    share), or follow `shares` (category: share; a category without one is left out)."""
    if shares is None:
        shares = {cat: len(POOL_SOURCES[cat]) / len(DOMAINS) for cat in files}
    total_share = sum(v for c, v in shares.items() if c in files and v > 0)
    quotas = {cat: round(total * shares[cat] / total_share) for cat in files if shares.get(cat, 0) > 0}
    quotas[max(quotas, key=lambda c: quotas[c])] += total - sum(quotas.values())
    return {
        "name": name, "seed": 0,
        "sources": [{"path": str(p.relative_to(root)), "name": cat, "format": "messages", "samples": quotas[cat],
                     "category": cat} for cat, p in files.items() if cat in quotas],
        "dedup": {"exact": True, "near": 0.85},
        "decontaminate": [{"path": str(decontaminate.relative_to(root)), "field": "prompt"}],
    }


def ablation_profile(profile_path: Path, how: str, files: dict[str, Path], out: Path) -> Path | None:
    """Return the profile `--match` gets for a variant (None: no --match), written beside the real one."""
    if how == "generic":
        return None
    if how == "both":
        return profile_path
    data = json.loads(profile_path.read_text(encoding="utf-8"))
    if how == "quotas":
        data["features"] = None
    elif how == "selection":
        weights = {cat: len(POOL_SOURCES[cat]) / len(DOMAINS) for cat in files}
        for cat, entry in data["categories"].items():
            entry["share"] = weights.get(cat, 0.0)
    else:
        raise ValueError(how)
    out.write_text(json.dumps(data), encoding="utf-8")
    return out


def build(files: dict[str, Path], root: Path, name: str, how: str, total: int, profile_path: Path,
          decontaminate: Path, domain_of: dict[str, str], shares: dict[str, float] | None = None) -> dict[str, Any]:
    """Build one mix with `build-mix`'s library call (the command's own); return its ids, per-domain
    counts, and the manifest's match and decontamination figures. `shares`: the recipe's category
    shares (None: uniform over the domains); `how` "shares" builds that recipe without --match."""
    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    recipe_path = root / f"recipe-{name}.yaml"
    recipe_path.write_text(yaml.safe_dump(_recipe(files, root, name, total, decontaminate, shares)), encoding="utf-8")
    match = None if how == "shares" else ablation_profile(profile_path, how, files, root / f"profile-{how}.json")
    t0 = time.perf_counter()
    manifest = build_mix(load_recipe(recipe_path), root / f"mix-{name}", match=match)
    seconds = time.perf_counter() - t0
    ids = mix_ids(root / f"mix-{name}")
    return {"ids": ids, "rows": len(ids), "build_s": round(seconds, 1), "domains": dict(Counter(domain_of.get(i, "?") for i in ids)),
            "match": manifest.get("match"), "decontaminated": manifest.get("total", {}).get("decontaminated"),
            "variant": how}


def start_builds(jobs: dict[str, tuple[Any, ...]], workers: int) -> Callable[[], dict[str, Any]]:
    """Start `build(*args)` for every job, in `workers` processes (0: here, now); return the call that
    waits for them and gives {name: result}. The builds are CPU work: the caller trains the target
    on the GPU meanwhile."""
    if workers <= 0:
        done = {name: build(*args) for name, args in jobs.items()}
        return lambda: done
    # spawned, not forked: the parent may hold CUDA state, which a forked child must not inherit
    pool = ProcessPoolExecutor(min(workers, len(jobs)), mp_context=get_context("spawn"))
    futures = {name: pool.submit(build, *args) for name, args in jobs.items()}

    def collect() -> dict[str, Any]:
        try:
            return {name: f.result() for name, f in futures.items()}
        finally:
            pool.shutdown()

    return collect


def mix_ids(mix_dir: Path) -> list[str]:
    """Return the ids of a finished mix, in its order."""
    from curator.rows.schema import open_mix

    return open_mix(mix_dir).ids()


def union_mix(mix_dirs: list[Path], out: Path) -> int:
    """Write one mix holding every row of `mix_dirs` once (by id); return its row count."""
    from curator.mix.publish import write_tables
    from curator.rows.schema import open_mix

    tables = [pq.read_table(f) for d in mix_dirs for f in open_mix(d).files]
    table = pa.concat_tables(tables, promote_options="default")
    seen: set[str] = set()
    keep = []
    for i, sid in enumerate(table.column("id").to_pylist()):
        if sid not in seen:
            seen.add(sid)
            keep.append(i)
    write_tables(out, [table.take(keep)], "union")
    return len(keep)
