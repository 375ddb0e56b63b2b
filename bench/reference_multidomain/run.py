"""The multi-domain reference: does a mix matched to the traffic beat a generic mix of the same
size, and does `curator forecast` predict the larger draft from the smaller ones. End to end on a
target trained on the spot, every stage through the toolkit's own code.

  1. target: a ~34M-parameter Llama trained for a few minutes on six domains (domains.py), in
     bench/reference's chat frame (a document's prefix, then its continuation)
  2. pool and traffic: the candidate pool holds prompts of all six domains, one source file each;
     the traffic (OpenAI request-log lines, tools declared on the agentic ones) uses four, in a
     skewed known mix (python 55%, tools 25%, arithmetic 10%, prose 10%), from documents neither the
     target nor the pool saw; a seeded part of it is held out for the measurement
  3. `curator profile` on the rest of the traffic: its category shares and features
  4. `build-mix`: generic (uniform over the six sources) and matched (`--match PROFILE`: the
     profile's category shares, traffic-like rows preferred inside a category) at 2K and 8K, and
     the ablation at 2K: quotas only, selection only; the held-out traffic in every `decontaminate:`
  5. `generate` and `hidden-states` once over the union of every mix's rows and over the held-out
     traffic; each draft trains on a view of the one store holding exactly its mix's rows
  6. drafts: same steps, same settings; per draft `curator eval`'s speculative decoding on
     held-out traffic prompts per category and traffic-weighted by the profile, the simulated
     estimate (the trainer's final evaluation on all held-out traffic) beside it
  7. forecast: drafts on nested subsets (1/8, 1/4, 1/2) of the matched 2K mix plus the 2K draft
     fit acceptance against samples per category (curator.forecast), which predicts the matched 8K
     draft's per-category and traffic-weighted acceptance with a band, set beside its measurement

Prints a table and one JSON line; `--out FILE` also writes the JSON after every stage and draft
(marked "partial" until the end). Runs on one GPU with torch, transformers, tokenizers,
safetensors, numpy, pyarrow, pyyaml, and pydantic + datasketch carried as wheels (see
bench/RESULTS.md). `--tiny` runs the same code at toy sizes on a CPU (the tests do).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import Counter
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.reference.run import Timer, run_saving, write_mix, write_results  # noqa: E402
from bench.reference.target import code_windows, train_target  # noqa: E402
from bench.reference_multidomain.curate import pool_sources, profile, start_builds, union_mix  # noqa: E402
from bench.reference_multidomain.domains import CATEGORY, DOMAINS, split_domains, tool_schemas  # noqa: E402
from curator import forecast as fc  # noqa: E402
from curator.generate import GenerateConfig, generate  # noqa: E402
from curator.traffic.classify import classify  # noqa: E402
from training.capture import hidden_states  # noqa: E402
from training.io.atomic import write_text  # noqa: E402
from training.eval.evaluate import evaluate, load_target  # noqa: E402
from training.eval.prompts import EvalPrompt  # noqa: E402
from training.eagle3.proposer import DraftProposer  # noqa: E402
from training.export.export import export_checkpoint  # noqa: E402
from training.eagle3.load import load_draft  # noqa: E402
from training.eval.simulate import traffic_weighted  # noqa: E402
from training.storage.reader import HiddenStateStore  # noqa: E402
from training.target.toy import train_tokenizer  # noqa: E402
from training.train.config import TrainConfig  # noqa: E402
from training.train.trainer import train  # noqa: E402

FIGURES = ("measured", "simulated")  # curator eval's speculative decoding; the simulated estimate beside it
TRAFFIC_MIX = {"python": 0.55, "tools": 0.25, "arithmetic": 0.10, "prose": 0.10}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    return write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def request(domain: str, prompt: str) -> dict[str, Any]:
    """Return one request as an OpenAI-compatible server logs it (tools declared for the agentic domain)."""
    row: dict[str, Any] = {"model": "reference-target", "messages": [{"role": "user", "content": prompt}]}
    if domain == "tools":
        row["tools"] = tool_schemas()
    return row


def weighted(per_category: dict[str, float], shares: dict[str, float]) -> float | None:
    """Return the traffic-weighted acceptance: per-category figures weighted by the profile's shares
    (renormalised over the categories measured), the rule of `curator eval --profile`
    (training.eval.simulate.traffic_weighted), here on plain figures: the trainer's simulated
    per-category acceptances and the forecast's predictions come as numbers, not decoding counts."""
    common = {c: s for c, s in shares.items() if c in per_category and s > 0}
    total = sum(common.values())
    return sum(per_category[c] * s for c, s in common.items()) / total if total else None


def prepare_data(args: argparse.Namespace, w: Path, tokenizer: Any, splits: dict,
                 pool_n: dict[str, int] | None = None, pool_density: dict[str, int] | None = None,
                 traffic_density: int = 1) -> dict[str, Any]:
    """Write the pool's source files, the traffic sample, its held-out part (a mix, for generation and
    capture) and the eval prompts; return what was written. `pool_n` / `pool_density`: candidates
    per domain and how densely they are cut (code_windows), where a comparison needs more of one."""
    # as many candidates of every domain: a generic mix drawn at random is then uniform over domains
    pool_n = {d: args.pool_per_domain for d in DOMAINS} | (pool_n or {})
    counts: dict[str, Any] = {"pool": {}, "traffic": {}}
    rows_by_domain = {}
    for i, d in enumerate(DOMAINS):
        prompts = [p for p, _ in code_windows(tokenizer, splits[d].pool, args.prefix_tokens, args.cont_tokens,
                                               pool_n[d], seed=100 + i, density=(pool_density or {}).get(d, 1))]
        rows_by_domain[d] = [{"id": f"{d}-{j:06d}", **request(d, p)} for j, p in enumerate(prompts)]
        counts["pool"][d] = len(prompts)
    sources, domain_of = pool_sources(rows_by_domain, w / "sources")
    traffic: list[tuple[str, dict[str, Any]]] = []
    for i, (d, share) in enumerate(TRAFFIC_MIX.items()):
        n = round(args.traffic * share)
        prompts = [p for p, _ in code_windows(tokenizer, splits[d].heldout, args.prefix_tokens, args.cont_tokens, n,
                                               seed=200 + i, density=traffic_density)]
        traffic += [(d, request(d, p)) for p in prompts]
        counts["traffic"][d] = len(prompts)
    random.Random(7).shuffle(traffic)
    # Each request's category is the traffic classifier's, as `curator profile` and a traffic
    # source's held-out split decide it: the measurement groups prompts the way the profile weighs them.
    labelled = [(d, classify(r["messages"], r.get("tools")).category, r) for d, r in traffic]
    confusion: dict[str, dict[str, int]] = {}
    for d, c, _ in labelled:
        confusion.setdefault(d, {}).setdefault(c, 0)
        confusion[d][c] += 1
    counts["classified_as"] = confusion
    held_n = round(len(labelled) * args.heldout_share)
    held, seen = labelled[:held_n], labelled[held_n:]
    write_jsonl(w / "traffic.jsonl", [r for _, _, r in seen])
    write_jsonl(w / "traffic-heldout.jsonl", [{"id": f"traffic-{j:06d}", "category": c, "prompt":
                                               r["messages"][0]["content"]} for j, (_, c, r) in enumerate(held)])
    counts["traffic_sample"], counts["traffic_heldout"] = len(seen), len(held)
    # the held-out traffic as a one-part mix, answered and captured like the pool
    write_mix(w / "mix-heldout", "traffic", [r["messages"][0]["content"] for _, _, r in held], [c for _, c, _ in held])
    eval_prompts: list[EvalPrompt] = []
    per_cat: dict[str, int] = {}
    for j, (_, c, r) in enumerate(held):
        if per_cat.get(c, 0) < args.eval_per_category:
            per_cat[c] = per_cat.get(c, 0) + 1
            eval_prompts.append(EvalPrompt(id=f"traffic-{j:06d}", messages=r["messages"], category=c))
    counts["eval_prompts"] = per_cat
    return {"sources": sources, "domain_of": domain_of, "counts": counts, "eval_prompts": eval_prompts}


def run(args: argparse.Namespace, save: Any = None) -> dict[str, Any]:
    """Run every stage; return the results. `save(results)` is called after each stage and draft."""
    save = save or (lambda _results: None)
    t_run = time.perf_counter()
    w = Path(args.workdir)
    w.mkdir(parents=True, exist_ok=True)
    device = args.device
    timer = Timer()
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "out"},
                               "traffic_mix": TRAFFIC_MIX, "categories": CATEGORY}

    with timer("data"):
        budget = {d: args.domain_bytes for d in DOMAINS}
        splits = split_domains(budget, traffic_share=args.traffic_share, seed=0)
        t0 = time.perf_counter()
        tokenizer = train_tokenizer([t for d in DOMAINS for t in splits[d].train[: max(1, len(splits[d].train) // 3)]],
                                    vocab_size=args.vocab)
        tok_s = time.perf_counter() - t0
        data = prepare_data(args, w, tokenizer, splits)
        results["data"] = data["counts"]
    with timer("profile"):
        prof = profile(w / "traffic.jsonl", w / "profile.json")
        shares = prof.shares()
        results["profile"] = {"shares": shares, "rows": {c: v.rows for c, v in prof.categories.items()}}
    print(json.dumps({"profile": results["profile"], "data": results["data"]}), flush=True)
    save(results)

    small, large = args.sizes
    mixes = {f"generic-{small}": ("generic", small), f"generic-{large}": ("generic", large),
             f"matched-{small}": ("both", small), f"matched-{large}": ("both", large),
             f"quotas-only-{small}": ("quotas", small), f"selection-only-{small}": ("selection", small)}
    jobs = {name: (data["sources"], w, name, how, n, w / "profile.json", w / "traffic-heldout.jsonl", data["domain_of"])
            for name, (how, n) in mixes.items()}
    with timer("build-mix-start"):
        collect = start_builds(jobs, args.build_workers)

    with timer("target"):
        pairs: list[tuple[str, str]] = []
        for i, d in enumerate(DOMAINS):
            pairs += code_windows(tokenizer, splits[d].train, args.prefix_tokens, args.cont_tokens,
                                  args.target_pairs_per_domain, seed=i)
        random.Random(0).shuffle(pairs)
        results["target"] = {
            **train_target(w / "target", tokenizer, pairs, seconds=args.target_seconds, steps=args.target_steps,
                           hidden_size=args.hidden, num_layers=args.layers,
                           seq_len=args.prefix_tokens + args.cont_tokens + 8, batch_size=args.target_batch,
                           device=device),
            "tokenizer_s": tok_s, "pairs": len(pairs),
            "documents": {d: {"train": len(s.train), "pool": len(s.pool), "traffic": len(s.heldout)}
                          for d, s in splits.items()},
        }
    print(json.dumps(results["target"]), flush=True)
    save(results)
    with timer("build-mix-wait"):
        built = collect()
    results["mixes"] = {k: {kk: vv for kk, vv in v.items() if kk != "ids"} for k, v in built.items()}
    print(json.dumps({"mixes": results["mixes"]}), flush=True)
    save(results)

    with timer("union"):
        union_rows = union_mix([w / f"mix-{name}" for name in mixes], w / "mix-union")
    results["union_rows"] = union_rows
    gen: dict[str, Any] = {}
    for name in ("union", "heldout"):
        with timer(f"generate-{name}"):
            stats = generate(GenerateConfig(mix=w / f"mix-{name}", out=w / f"gen-{name}", model=str(w / "target"),
                                            backend="transformers", temperature=0.0, max_tokens=args.cont_tokens,
                                            batch_size=args.gen_batch, device=device))
        gen[name] = {"samples": stats.done_total, "output_tokens": stats.completion_tokens,
                     "output_tokens_per_s": round(stats.output_tokens_per_s)}
        with timer(f"hidden-states-{name}"):
            hs = hidden_states.run(w / "target", w / f"gen-{name}", w / f"states-{name}", dtype="bf16")
        gen[name].update(capture_tokens=hs.tokens, capture_tokens_per_s=round(hs.tokens_per_s))
    results["generate"] = gen
    results["stages_s"] = timer.stages
    save(results)

    held_store = w / "states-heldout"
    target, tok = load_target(w / "target", device=device, dtype=torch.float32)
    union_store = HiddenStateStore.open(w / "states-union")
    draft_rows: dict[str, Any] = {}
    results["drafts"] = draft_rows

    skipped: dict[str, str] = {}
    results["skipped_drafts"] = skipped
    last_s = [0.0]

    def draft(tag: str, ids: list[str], options: dict[str, bool] | None = None) -> None:
        # a run with a wall-clock limit skips what would not finish, and says so, instead of being killed
        elapsed = time.perf_counter() - t_run
        if args.stop_after_s and elapsed + last_s[0] > args.stop_after_s:
            skipped[tag] = f"not started: {elapsed:.0f} s gone, a draft takes ~{last_s[0]:.0f} s, limit {args.stop_after_s:g} s"
            save(results)
            return
        t_draft = time.perf_counter()
        ids = [i for i in ids if i in union_store]
        view = fc.subset_store(w / "states-union", ids, w / "views" / tag)
        cfg = TrainConfig(
            data=str(view), eval_data=str(held_store), target=str(w / "target"), out=str(w / f"run-{tag}"),
            draft_vocab_size=args.vocab, ttt_steps=args.ttt_steps, lr=args.lr, warmup_ratio=0.03,
            global_batch_size=args.batch, micro_batch_size=args.batch, max_steps=args.train_steps,
            max_length=args.prefix_tokens + args.cont_tokens + 32, eval_max_samples=None,
            log_every=max(1, args.train_steps // 4), eval_every=0, save_every=0, device=device, seed=0,
            **(options or {}),  # --variants: EAGLE-3.1's norm options
        )
        with timer(f"train-{tag}"):
            result = train(cfg)
        # SGLang's layout has no norm_before_residual (export refuses it): that variant goes out as speculators'
        fmt = "speculators" if (options or {}).get("norm_before_residual") else "sglang"
        export_checkpoint(w / f"run-{tag}", w / f"export-{tag}", fmt=fmt, verifier="reference/target")
        model = load_draft(w / f"export-{tag}", w / "target").to(torch.bfloat16 if device == "cuda" else torch.float32)
        model = model.to(device)
        with timer(f"eval-{tag}"):
            report = evaluate(target, tok, DraftProposer(model), data["eval_prompts"], steps=args.ttt_steps,
                              max_new_tokens=args.eval_new_tokens, tie_margin=1e-2 if device == "cuda" else 1e-4)
        measured = {c: round(s.acceptance_length, 4) for c, s in report.categories.items() if s.forwards}
        sim = {c: round(v, 4) for c, v in (result.eval.get("sim_categories") or {}).items()}
        counts = dict(Counter(union_store.category(i) for i in ids))
        row = {"samples": len(ids), "category_samples": counts, "train_steps": result.step,
               "measured": measured,
               "measured_weighted": _r(traffic_weighted(report.categories, shares)["acceptance_length"]),
               "measured_overall": round(report.overall.acceptance_length, 4),
               "simulated": sim, "simulated_weighted": _r(weighted(sim, shares)),
               "eval_prompts": len(report.prompts), "greedy_ties": report.ties}
        draft_rows[tag] = row
        last_s[0] = time.perf_counter() - t_draft
        print(json.dumps({tag: row}), flush=True)
        # recomputed after every draft: a run cut short keeps every comparison it can make
        results["forecast"] = {k: forecast_check(draft_rows, small, large, args.ttt_steps, shares, k) for k in FIGURES}
        results["findings"] = {k: findings(draft_rows, small, large, k) for k in FIGURES}
        results["stages_s"] = timer.stages
        save(results)

    if args.variants:  # EAGLE-3.1's norms on the matched small mix: same data, steps and settings
        from bench.eagle31_variants import VARIANTS

        for name in args.variants.split(","):
            draft(f"matched-{small}+{name}", built[f"matched-{small}"]["ids"], VARIANTS[name])
        if args.variants_only:
            results["stages_s"] = timer.stages
            return results
    order = [f"matched-{small}", f"generic-{small}", f"generic-{large}", f"matched-{large}"]
    for name in order:
        draft(name, built[name]["ids"])
    # the forecast's small drafts: nested subsets of the matched small mix, same regime
    m_small = built[f"matched-{small}"]["ids"]
    by_cat: dict[str, list[str]] = {}
    for sid in m_small:
        if sid in union_store:
            by_cat.setdefault(union_store.category(sid), []).append(sid)
    for frac, ids in fc.nested_subsets(by_cat, args.fractions, seed=0).items():
        if frac < 1:
            draft(f"matched-{small}-x{frac:g}", ids)
    for name in (f"quotas-only-{small}", f"selection-only-{small}"):
        draft(name, built[name]["ids"])
    results["stages_s"] = timer.stages
    return results


def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 4)


def forecast_check(rows: dict[str, Any], small: int, large: int, steps: int, shares: dict[str, float],
                   figure: str = "measured") -> dict[str, Any]:
    """Return the forecast made from the drafts of at most `small` samples, for the matched `large`
    draft's category counts, beside that draft's acceptance (`figure`: measured or simulated)."""
    tags = [t for t in rows if t.startswith(f"matched-{small}")]
    pts = fc.points_by_category([(rows[t]["category_samples"], rows[t][figure]) for t in tags])
    big = rows.get(f"matched-{large}")
    out: dict[str, Any] = {"from_drafts": tags, "categories": {}}
    if big is None:
        return out
    preds, draws = {}, {}
    for cat, points in sorted(pts.items()):
        fitted, best = fc.best_fit(points, steps)
        n = big["category_samples"].get(cat)
        if best is None or not n:
            continue
        sample = best.predict_draws(n, seed=1)
        preds[cat], draws[cat] = best.predict(n), sample
        lo, hi = (float(v) for v in _percentiles(sample))
        got = big[figure].get(cat)
        out["categories"][cat] = {
            "points": [[p.samples, p.acceptance] for p in points], "law": best.law,
            "rmse": {k: round(f.rmse, 4) for k, f in fitted.items()}, "samples": n,
            "predicted": round(preds[cat], 4), "band": [round(lo, 4), round(hi, 4)], "measured": got,
            "error": None if got is None else round(preds[cat] / got - 1, 4),
        }
    w_pred = weighted(preds, shares)
    if w_pred is not None:
        common = [c for c in preds if shares.get(c)]
        total = sum(shares[c] for c in common)
        mix = sum(draws[c] * shares[c] for c in common) / total
        lo, hi = _percentiles(mix)
        got = big[f"{figure}_weighted"]
        out["weighted"] = {"predicted": round(w_pred, 4), "band": [round(float(lo), 4), round(float(hi), 4)],
                           "measured": got, "error": None if got is None else round(w_pred / got - 1, 4),
                           "within_5_percent": None if got is None else abs(w_pred / got - 1) <= 0.05}
    return out


def goal_forecast(saved: dict[str, Any], goal: float, figure: str) -> dict[str, Any]:
    """Return `curator forecast`'s answer for `goal` from a saved run's matched drafts, priced at the
    run's own generation figures (tokens per sample, output tokens/s) and the target's bytes per token."""
    from training.storage.format import bytes_per_token

    rows, s = saved["drafts"], saved["settings"]
    pts = fc.points_by_category([(r["category_samples"], r[figure]) for t, r in rows.items() if t.startswith("matched-")])
    g = saved["generate"]["union"]
    gen = fc.GenerationCost({c: g["capture_tokens"] / g["samples"] for c in pts},
                            {c: g["output_tokens"] / g["samples"] for c in pts}, g["output_tokens_per_s"], 1,
                            "the run's union generation")
    return fc.make_forecast(pts, goal, s["ttt_steps"], generation=gen,
                            bytes_per_token=bytes_per_token(s["hidden"], 3, "bf16", True)).to_json()


def _percentiles(values: Any) -> tuple[float, float]:
    import numpy as np

    lo, hi = np.percentile(np.asarray(values), fc.BAND)
    return float(lo), float(hi)


def findings(rows: dict[str, Any], small: int, large: int, figure: str = "measured") -> dict[str, Any]:
    """Return the comparisons the issue asks for: matched small vs generic large, the data-efficiency
    ratio read off the generic curve (log-linear through its two sizes), and the ablation."""
    def wm(tag: str) -> float | None:
        return rows.get(tag, {}).get(f"{figure}_weighted")

    out: dict[str, Any] = {}
    m_small, g_small, g_large = wm(f"matched-{small}"), wm(f"generic-{small}"), wm(f"generic-{large}")
    if m_small is not None and g_large is not None:
        out["matched_small_vs_generic_large"] = round(m_small - g_large, 4)
    if None not in (m_small, g_small, g_large) and g_large > g_small:
        b = (g_large - g_small) / math.log(large / small)
        n = small * math.exp((m_small - g_small) / b)
        out["data_efficiency"] = {"generic_samples_matching_matched_small": round(n), "ratio": round(n / small, 2),
                                  "law": "log-linear through the generic sizes"}
    elif None not in (m_small, g_small, g_large):
        out["data_efficiency"] = {"ratio": None, "why": "the generic curve does not rise between its two sizes"}
    base = g_small
    if base is not None:
        out["ablation_gain_over_generic"] = {k: None if wm(t) is None else round(wm(t) - base, 4) for k, t in (
            ("quotas_only", f"quotas-only-{small}"), ("selection_only", f"selection-only-{small}"),
            ("both", f"matched-{small}"))}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="/tmp/curator-reference-multidomain")
    p.add_argument("--out", default=None, help="also write the results JSON here")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="toy sizes for a CPU smoke run")
    p.add_argument("--target-seconds", type=float, default=75.0)
    p.add_argument("--target-steps", type=int, default=None)
    p.add_argument("--domain-bytes", type=int, default=20_000_000, help="text per domain")
    p.add_argument("--traffic-share", type=float, default=0.05, help="share of each domain's documents kept for traffic")
    p.add_argument("--target-pairs-per-domain", type=int, default=40_000)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--target-batch", type=int, default=128)
    p.add_argument("--prefix-tokens", type=int, default=64)
    p.add_argument("--cont-tokens", type=int, default=64)
    p.add_argument("--pool-per-domain", type=int, default=4000, help="candidate prompts per domain")
    p.add_argument("--traffic", type=int, default=1000, help="traffic requests in all")
    p.add_argument("--heldout-share", type=float, default=0.2)
    p.add_argument("--sizes", default="2000,8000")
    p.add_argument("--fractions", default="0.125,0.25,0.5")
    p.add_argument("--gen-batch", type=int, default=512)
    p.add_argument("--ttt-steps", type=int, default=4)
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-per-category", type=int, default=6)
    p.add_argument("--eval-new-tokens", type=int, default=40)
    p.add_argument("--findings-from", default=None, help="print the forecast check and findings of a saved run's JSON")
    p.add_argument("--goal", type=float, default=3.0, help="with --findings-from: the goal the forecast is asked for")
    p.add_argument("--stop-after-s", type=float, default=None,
                   help="start no draft that the last one's time says would end past this many seconds")
    p.add_argument("--build-workers", type=int, default=6,
                   help="processes building the mixes while the target trains (0: one after another, first)")
    p.add_argument("--variants", default="", help="also train the matched small mix's draft once per EAGLE-3.1 "
                   "norm variant (bench/eagle31_variants.py VARIANTS, comma-separated)")
    p.add_argument("--variants-only", action="store_true", help="with --variants: train only those drafts")
    args = p.parse_args(argv)
    if args.tiny:
        args.target_seconds, args.domain_bytes, args.vocab, args.hidden, args.layers = 3.0, 150_000, 384, 64, 4
        args.target_pairs_per_domain, args.target_batch, args.prefix_tokens, args.cont_tokens = 200, 8, 16, 8
        args.pool_per_domain, args.traffic, args.sizes, args.traffic_share = 40, 120, "24,48", 0.2
        args.gen_batch, args.train_steps, args.batch, args.eval_per_category, args.eval_new_tokens = 32, 3, 2, 1, 6
        args.build_workers = 0
    args.sizes = [int(x) for x in str(args.sizes).split(",")] if isinstance(args.sizes, str) else args.sizes
    args.fractions = [float(x) for x in str(args.fractions).split(",")] if isinstance(args.fractions, str) else args.fractions
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.findings_from:
        # the comparisons again from a finished run's JSON, with this code (no GPU, nothing rerun)
        saved = json.loads(Path(args.findings_from).read_text(encoding="utf-8"))
        small, large = saved["settings"]["sizes"]
        steps, shares, rows = saved["settings"]["ttt_steps"], saved["profile"]["shares"], saved["drafts"]
        print(json.dumps({"forecast": {k: forecast_check(rows, small, large, steps, shares, k) for k in FIGURES},
                          "findings": {k: findings(rows, small, large, k) for k in FIGURES},
                          "goal": {k: goal_forecast(saved, args.goal, k) for k in FIGURES}}, indent=1))
        return 0
    results = run_saving(args, run, default=str)
    print(f"{'draft':>24} {'samples':>7} {'measured (weighted)':>19} {'simulated (weighted)':>20}  per category measured")
    for tag, row in results["drafts"].items():
        per = " ".join(f"{c}={v:.2f}" for c, v in sorted(row["measured"].items()))
        print(f"{tag:>24} {row['samples']:>7} {row['measured_weighted'] or float('nan'):>19.3f} "
              f"{row['simulated_weighted'] or float('nan'):>20.3f}  {per}")
    print(json.dumps({"forecast": results.get("forecast"), "findings": results.get("findings")}))
    write_results(args, results, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
