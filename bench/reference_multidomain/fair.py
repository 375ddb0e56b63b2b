"""The multi-domain reference's proof, redone fairly (issue 39, items 1 and 3): does a mix matched to
the traffic reach a given acceptance with less target inference than what users pick instead?

Same target, pool, traffic and toolkit stages as run.py (its data preparation, `curator profile`,
`build-mix`, `generate`, `hidden-states`, the trainer, `curator eval`'s speculative decoding), with
three arms, each at two sizes (2K and 8K):

    generic   a named public blend's published composition: the EAGLE-3 paper's ShareGPT 68K +
              UltraChat 462K (DESIGN.md; recipes/eagle3-paper.yaml, whose sources are all `chat`):
              the shares are read from that recipe's samples per category
    hand      the original case's hand-made agentic-heavy mix: recipes/agentic-coding-100k.yaml's
              samples per category (agentic 22.8K, code / reasoning / chat 25K each), rows at random
    matched   `build-mix --match PROFILE`: the traffic profile's shares, traffic-like rows preferred

Every draft trains the same number of epochs (so the 8K draft gets 4x the steps of the 2K one: the
target inference both cost is what is compared), and the simulated figure is read at every epoch:
the best epoch's weights are kept beside the last ones (early stopping on the held-out simulated
figure), so one training run gives both the equal-epoch and the best point. Three seeds per cell
(the draft's initialisation and the batch order). The matched arm adds nested subsets (1/8, 1/4,
1/2 of its 2K mix: the forecast's small drafts); `--variants` adds EAGLE-3.1's norms on the matched
2K and 8K mixes (seed 0).

The drafts are small and their steps launch-bound, so `--workers` processes train and measure them
side by side on one GPU, most important first (seed 0's cells, the forecast's subsets, seeds 1 and
2, the variants, then the measured figure at the best epochs). `--stop-after-s` starts no job that
its kind's slowest time so far says would end past the limit; what was not run is listed under
`skipped` in the JSON, never filled in.

    python3 bench/reference_multidomain/fair.py --workdir /tmp/fair --out fair.json --stop-after-s 540
    python3 bench/reference_multidomain/fair.py --findings-from fair.json     # the tables again

`--tiny` runs the same code at toy sizes on a CPU (the tests do).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.reference.run import Timer, run_saving, write_results  # noqa: E402
from bench.reference.target import code_windows, train_target  # noqa: E402
from bench.reference_multidomain.curate import pool_sources, profile, start_builds, union_mix  # noqa: E402
from bench.reference_multidomain.domains import CATEGORY, DOMAINS, split_domains  # noqa: E402
from bench.reference_multidomain.run import TRAFFIC_MIX, prepare_data, weighted  # noqa: E402

ARMS = ("generic", "hand", "matched")
# where each arm's category shares come from (read at run time, recorded in the JSON)
ARM_RECIPES = {"generic": ROOT / "recipes" / "eagle3-paper.yaml", "hand": ROOT / "recipes" / "agentic-coding-100k.yaml"}
ARM_BLENDS = {
    "generic": "EAGLE-3 paper blend: ShareGPT 68K + UltraChat 462K (DESIGN.md; recipes/eagle3-paper.yaml)",
    "hand": "the original case's agentic-heavy mix (recipes/agentic-coding-100k.yaml; DESIGN.md step 3)",
    "matched": "build-mix --match PROFILE (the traffic's profile: shares and DSIR selection)",
}
_pool_sources = pool_sources  # re-exported for the tests' fixtures


def recipe_shares(path: Path) -> dict[str, float]:
    """Return a recipe's category shares: its sources' samples summed per category, normalised."""
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    counts: Counter[str] = Counter()
    for source in data["sources"]:
        counts[source["category"]] += int(source["samples"])
    total = sum(counts.values())
    return {c: n / total for c, n in sorted(counts.items())}


# ---------------------------------------------------------------- jobs, run in worker processes

@dataclass
class Job:
    """One unit of work for a worker: train a draft, or measure an exported checkpoint."""

    kind: str  # "train" | "measure" | "greedy"
    tag: str
    priority: float
    payload: dict[str, Any] = field(default_factory=dict)
    seq: int = 0

    def key(self) -> tuple[float, int]:
        return (self.priority, self.seq)


_CTX: dict[str, Any] = {}


def _init_worker(ctx: dict[str, Any]) -> None:
    _CTX.clear()
    _CTX.update(ctx)
    torch.set_num_threads(ctx.get("threads", 1))
    # every worker compiles the trainer's kernels once: a few compile processes each, not one per core
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "2")


def _target() -> tuple[Any, Any]:
    if "target" not in _CTX:
        from training.eval.evaluate import load_target

        _CTX["target"] = load_target(_CTX["target_dir"], device=_CTX["device"], dtype=torch.float32)
    return _CTX["target"]


def run_job(job: Job) -> dict[str, Any]:
    """Run one job in this process; return its result (plain data: it crosses processes)."""
    t0 = time.perf_counter()
    out = {"train": _train_job, "measure": _measure_job, "greedy": _greedy_job}[job.kind](job)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    out["pid"] = os.getpid()
    return out


def _train_job(job: Job) -> dict[str, Any]:
    """Train one draft for `epochs` epochs, the simulated figure read at every epoch; keep the last
    checkpoint and the best epoch's (by the traffic-weighted simulated figure); return the curve."""
    import shutil

    from curator import forecast as fc
    from training.train.config import TrainConfig
    from training.train.trainer import train

    c, p = _CTX, job.payload
    w = Path(c["workdir"])
    ids: list[str] = p["ids"]
    view = fc.subset_store(w / "states-union", ids, w / "views" / job.tag)
    per_epoch = len(ids) // c["batch"]
    run_dir = w / f"run-{job.tag}"
    curve: list[dict[str, Any]] = []
    best: dict[str, Any] = {}

    def on_metrics(record: dict[str, Any]) -> None:
        if record.get("split") != "eval":
            return
        step = int(record["step"])
        sim = {k: round(v, 4) for k, v in (record.get("sim_categories") or {}).items()}
        entry = {"epoch": round(step / per_epoch, 4), "steps": step, "sequences": step * c["batch"],
                 "simulated": sim, "simulated_weighted": _r(weighted(sim, c["shares"]))}
        curve.append(entry)
        if not best or (entry["simulated_weighted"] or 0) > (best["simulated_weighted"] or 0):
            best.clear()
            best.update(entry)
        # the checkpoint of this step is saved right after this call: the earlier ones are dropped
        # unless they hold the best epoch (disk: a draft keeps at most two)
        for ckpt in (run_dir / "checkpoints").glob("step-*"):
            if int(ckpt.name.split("-")[1]) != best["steps"]:
                shutil.rmtree(ckpt, ignore_errors=True)

    cfg = TrainConfig(
        data=str(view), eval_data=str(w / "states-heldout"), target=str(w / "target"), out=str(run_dir),
        draft_vocab_size=c["vocab"], ttt_steps=c["ttt_steps"], lr=c["lr"], warmup_ratio=0.03,
        global_batch_size=c["batch"], micro_batch_size=c["batch"], epochs=float(c["epochs"]), max_steps=None,
        max_length=c["max_length"], eval_max_samples=None, log_every=max(1, per_epoch), eval_every=per_epoch,
        save_every=per_epoch, device=c["device"], seed=p["seed"], **p.get("options", {}),
    )
    result = train(cfg, on_metrics=on_metrics)
    sim = {k: round(v, 4) for k, v in (result.eval.get("sim_categories") or {}).items()}
    return {"tag": job.tag, "train_steps": result.step, "per_epoch": per_epoch, "curve": curve, "best": best,
            "simulated": sim, "simulated_weighted": _r(weighted(sim, c["shares"])),
            "final_checkpoint": str(result.checkpoint),
            "best_checkpoint": str(run_dir / "checkpoints" / f"step-{best['steps']:07d}") if best else None,
            "train_tokens_per_s": round(result.train.get("tokens_per_s", 0.0))}


def _greedy_job(job: Job) -> dict[str, Any]:
    """Decode every eval prompt greedily once: each draft's measurement compares against these."""
    from training.eval.decode import greedy_decode
    from training.eval.evaluate import eos_token_ids
    from training.eval.prompts import render_prompt

    target, tok = _target()
    eos = eos_token_ids(target, tok)
    out = {}
    for prompt in _CTX["eval_prompts"]:
        try:
            ids = render_prompt(tok, prompt.messages)
        except Exception:  # evaluate() skips and counts such a prompt itself
            continue
        if ids:
            out[prompt.id] = greedy_decode(target, ids, _CTX["eval_new_tokens"], eos)
    return {"greedy": out}


def _measure_job(job: Job) -> dict[str, Any]:
    """Export one checkpoint and measure it with `curator eval`'s speculative decoding on the eval prompts."""
    from training.eagle3.load import load_draft
    from training.eval.evaluate import evaluate
    from training.eagle3.proposer import DraftProposer
    from training.eval.simulate import traffic_weighted
    from training.export.export import export_checkpoint

    c, p = _CTX, job.payload
    w = Path(c["workdir"])
    # SGLang's layout has no norm_before_residual (export refuses it): that variant goes out as speculators'
    fmt = "speculators" if p.get("options", {}).get("norm_before_residual") else "sglang"
    export = w / f"export-{job.tag}-{p['point']}"
    export_checkpoint(p["checkpoint"], export, fmt=fmt, verifier="reference/target")
    target, tok = _target()
    cuda = c["device"] == "cuda"
    model = load_draft(export, w / "target").to(torch.bfloat16 if cuda else torch.float32).to(c["device"])
    extra = {"greedy": p["greedy"]} if p.get("greedy") is not None else {}
    report = evaluate(target, tok, DraftProposer(model), c["eval_prompts"], steps=c["ttt_steps"],
                      max_new_tokens=c["eval_new_tokens"], tie_margin=1e-2 if cuda else 1e-4, **extra)
    measured = {k: round(s.acceptance_length, 4) for k, s in report.categories.items() if s.forwards}
    return {"tag": job.tag, "point": p["point"], "measured": measured,
            "measured_weighted": _r(traffic_weighted(report.categories, c["shares"])["acceptance_length"]),
            "measured_overall": round(report.overall.acceptance_length, 4), "eval_prompts": len(report.prompts),
            "eval_prompts_per_category": dict(Counter(r.category for r in report.prompts)),
            "greedy_ties": report.ties, "greedy_cached": bool(extra)}


# ---------------------------------------------------------------- the scheduler

class Scheduler:
    """Run jobs on `workers` processes, most important (lowest priority number) first, starting none
    that the slowest finished job of its kind says would end past `deadline` (perf_counter time)."""

    def __init__(self, workers: int, ctx: dict[str, Any], deadline: float | None, guesses: dict[str, float]) -> None:
        self.workers = max(1, workers)
        self.pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"), initializer=_init_worker,
                                        initargs=(ctx,))
        self.deadline = deadline
        self.guesses = dict(guesses)
        self.pending: list[Job] = []
        self.running: dict[Future, tuple[Job, float]] = {}
        self.skipped: dict[str, str] = {}
        self.seq = 0
        self.timeline: list[dict[str, Any]] = []
        self._observed: set[str] = set()

    def add(self, job: Job) -> None:
        self.seq += 1
        job.seq = self.seq
        self.pending.append(job)
        self.pending.sort(key=Job.key)

    def _estimate(self, job: Job) -> float:
        return self.guesses.get(job.payload.get("size_key", job.kind), self.guesses.get(job.kind, 60.0))

    def _fill(self) -> None:
        now = time.perf_counter()
        while len(self.running) < self.workers and self.pending:
            for i, job in enumerate(self.pending):
                if job.kind == "measure" and job.payload.get("needs_greedy") and job.payload.get("greedy") is None:
                    continue  # waits for the greedy pass
                if self.deadline is not None and now + self._estimate(job) > self.deadline:
                    self.pending.pop(i)
                    self.skipped[f"{job.kind}:{job.tag}" + (f":{job.payload['point']}" if "point" in job.payload else "")] = (
                        f"not started: {self.deadline - now:.0f} s left, a {job.kind} job takes ~{self._estimate(job):.0f} s")
                    break
                self.pending.pop(i)
                self.running[self.pool.submit(run_job, job)] = (job, now)
                break
            else:
                return  # only jobs waiting on the greedy pass are left

    def done(self) -> bool:
        return not self.pending and not self.running

    def release_greedy(self) -> None:
        """Let the measurements waiting on the greedy pass run without it (it failed)."""
        for job in self.pending:
            job.payload["needs_greedy"] = False

    def next_results(self) -> list[tuple[Job, dict[str, Any] | BaseException]]:
        self._fill()
        if not self.running:
            return []
        finished, _ = wait(list(self.running), return_when=FIRST_COMPLETED)
        out = []
        for fut in finished:
            job, started = self.running.pop(fut)
            seconds = time.perf_counter() - started
            key = job.payload.get("size_key", job.kind)
            self.guesses[key] = max(seconds, self.guesses.get(key, 0.0) if key in self._observed else 0.0)
            self._observed.add(key)
            self.timeline.append({"job": f"{job.kind}:{job.tag}", "wall_s": round(seconds, 1)})
            exc = fut.exception()
            out.append((job, exc if exc is not None else fut.result()))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------- the run

def draft_plan(args: argparse.Namespace, built: dict[str, Any], union_ids: set[str],
               category_of: dict[str, str]) -> list[dict[str, Any]]:
    """Return every draft to train, in priority order: seed 0's cells, the forecast's subsets, the
    other seeds' cells, the EAGLE-3.1 variants."""
    from curator import forecast as fc

    small, large = args.sizes
    plan: list[dict[str, Any]] = []

    def add(tag: str, arm: str, size: int, mix: str, seed: int, prio: float, ids: list[str] | None = None,
            variant: str = "", options: dict[str, bool] | None = None, fraction: float = 1.0) -> None:
        ids = [i for i in (ids if ids is not None else built[mix]["ids"]) if i in union_ids]
        plan.append({"tag": tag, "arm": arm, "size": size, "mix": mix, "seed": seed, "priority": prio, "ids": ids,
                     "variant": variant, "options": options or {}, "fraction": fraction})

    for s_i, seed in enumerate(args.seeds):
        for arm in args.arms:
            for size in args.sizes:
                add(f"{arm}-{size}-s{seed}", arm, size, f"{arm}-{size}", seed, prio=10 * s_i + (2 if s_i else 0))
        if s_i == 0 and "matched" in args.arms and args.fractions:
            by_cat: dict[str, list[str]] = {}
            for sid in built[f"matched-{small}"]["ids"]:
                if sid in union_ids:
                    by_cat.setdefault(category_of[sid], []).append(sid)
            for frac, ids in fc.nested_subsets(by_cat, args.fractions, seed=0).items():
                if frac < 1:
                    add(f"matched-{small}-x{frac:g}-s{seed}", "matched", small, f"matched-{small}", seed, prio=1,
                        ids=ids, fraction=frac)
    if args.variants:
        from bench.eagle31_variants import VARIANTS

        for name in args.variants:
            for size in args.variant_sizes or args.sizes:
                add(f"matched-{size}+{name}-s{args.seeds[0]}", "matched", size, f"matched-{size}", args.seeds[0],
                    prio=40, variant=name, options=VARIANTS[name])
    return plan


def run(args: argparse.Namespace, save: Any = None) -> dict[str, Any]:
    """Run every stage; return the results. `save(results)` is called after each stage and job."""
    save = save or (lambda _results: None)
    t_run = time.perf_counter()
    deadline = t_run + args.stop_after_s if args.stop_after_s else None
    w = Path(args.workdir)
    w.mkdir(parents=True, exist_ok=True)
    device = args.device
    timer = Timer()
    arm_shares = {arm: recipe_shares(path) for arm, path in ARM_RECIPES.items()}
    results: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"}, "traffic_mix": TRAFFIC_MIX,
        "categories": CATEGORY, "arms": {a: {"blend": ARM_BLENDS[a], "shares": arm_shares.get(a, "the traffic profile's")}
                                         for a in args.arms}}

    from training.capture import hidden_states
    from training.storage.reader import HiddenStateStore
    from training.target.toy import train_tokenizer
    from curator.generate import GenerateConfig, generate

    with timer("data"):
        budget = {d: args.domain_bytes * (args.prose_bytes_factor if d == "prose" else 1) for d in DOMAINS}
        splits = split_domains(budget, traffic_share=args.traffic_share, seed=0)
        tokenizer = train_tokenizer([t for d in DOMAINS for t in splits[d].train[: max(1, len(splits[d].train) // 3)]],
                                    vocab_size=args.vocab)
        # the generic arm is all chat: the prose pool must hold the large size whole
        data = prepare_data(args, w, tokenizer, splits, pool_n={"prose": args.prose_pool},
                            pool_density={"prose": args.prose_density}, traffic_density=args.traffic_density)
        results["data"] = data["counts"]
    with timer("profile"):
        prof = profile(w / "traffic.jsonl", w / "profile.json")
        shares = prof.shares()
        results["profile"] = {"shares": shares, "rows": {c: v.rows for c, v in prof.categories.items()}}
    results["arms"].get("matched", {})["shares"] = shares
    print(json.dumps({"profile": results["profile"], "data": results["data"]}), flush=True)
    save(results)

    how = {"generic": "shares", "hand": "shares", "matched": "both"}
    jobs = {f"{arm}-{n}": (data["sources"], w, f"{arm}-{n}", how[arm], n, w / "profile.json",
                           w / "traffic-heldout.jsonl", data["domain_of"], arm_shares.get(arm))
            for arm in args.arms for n in args.sizes}
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
            "pairs": len(pairs),
            "documents": {d: {"train": len(s.train), "pool": len(s.pool), "traffic": len(s.heldout)}
                          for d, s in splits.items()},
        }
    print(json.dumps(results["target"]), flush=True)
    with timer("build-mix-wait"):
        built = collect()
    results["mixes"] = {k: {kk: vv for kk, vv in v.items() if kk != "ids"} for k, v in built.items()}
    print(json.dumps({"mixes": results["mixes"]}), flush=True)
    save(results)

    with timer("union"):
        results["union_rows"] = union_mix([w / f"mix-{name}" for name in jobs], w / "mix-union")
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
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the workers share the card

    union_store = HiddenStateStore.open(w / "states-union")
    union_ids = set(union_store.ids())
    category_of = {sid: union_store.category(sid) for sid in union_ids}
    plan = draft_plan(args, built, union_ids, category_of)
    results["drafts"], results["skipped"] = {}, {}
    ctx = {"workdir": str(w), "target_dir": str(w / "target"), "device": device, "shares": shares,
           "vocab": args.vocab, "ttt_steps": args.ttt_steps, "lr": args.lr, "batch": args.batch,
           "epochs": args.epochs, "max_length": args.prefix_tokens + args.cont_tokens + 32,
           "eval_prompts": data["eval_prompts"], "eval_new_tokens": args.eval_new_tokens, "threads": args.threads}
    guesses = {"greedy": 60.0, "measure": args.guess_measure_s,
               **{f"train-{n}": args.guess_train_s * n / args.sizes[0] for n in args.sizes}}
    sched = Scheduler(args.workers, ctx, deadline, guesses)
    rows: dict[str, Any] = results["drafts"]
    by_tag = {d["tag"]: d for d in plan}
    greedy: dict[str, Any] | None = None
    waiting_greedy: list[Job] = []
    sched.add(Job("greedy", "eval-prompts", 44 if args.train_first else -1))
    for d in plan:
        size_key = f"train-{min(args.sizes, key=lambda n: abs(n - len(d['ids'])))}"
        sched.add(Job("train", d["tag"], d["priority"], {"ids": d["ids"], "seed": d["seed"], "options": d["options"],
                                                         "size_key": size_key}))
    try:
        while not sched.done():
            for job, res in sched.next_results():
                if isinstance(res, BaseException):
                    results["skipped"][f"{job.kind}:{job.tag}"] = f"failed: {type(res).__name__}: {res}"
                    print(f"[{job.kind} {job.tag}] FAILED {type(res).__name__}: {res}", flush=True)
                    if job.kind == "greedy":
                        waiting_greedy.clear()
                        sched.release_greedy()
                    continue
                if job.kind == "greedy":
                    greedy = res["greedy"]
                    for m in waiting_greedy:
                        m.payload["greedy"] = greedy
                    results["greedy_s"] = res["seconds"]
                elif job.kind == "train":
                    d = by_tag[job.tag]
                    rows[job.tag] = draft_row(d, res, category_of, args)
                    # --train-first: every draft's simulated curve before any measurement
                    end_prio = (45 + d["priority"] / 100) if args.train_first else d["priority"] + 0.5
                    points = [("end", res["final_checkpoint"], end_prio)]
                    if res["best_checkpoint"] and res["best"]["steps"] != res["train_steps"]:
                        points.append(("best", res["best_checkpoint"], 50 + d["priority"] / 100))
                    for point, ckpt, prio in points:
                        m = Job("measure", job.tag, prio, {"checkpoint": ckpt, "point": point, "options": d["options"],
                                                           "needs_greedy": "greedy_s" not in results and not
                                                           results["skipped"].get("greedy:eval-prompts"),
                                                           "greedy": greedy})
                        if greedy is None:
                            waiting_greedy.append(m)
                        sched.add(m)
                else:
                    row = rows[job.tag]
                    keys = ("measured", "measured_weighted", "measured_overall", "eval_prompts",
                            "eval_prompts_per_category", "greedy_ties", "greedy_cached")
                    if res["point"] == "end":
                        row.update({k: res[k] for k in keys})
                        if row["best"].get("steps") == row["train_steps"]:  # the last epoch was the best
                            row["best"].update({k: res[k] for k in ("measured", "measured_weighted")})
                    else:
                        row["best"].update({k: res[k] for k in ("measured", "measured_weighted")})
                print(f"[{job.kind} {job.tag}{':' + res.get('point', '') if job.kind == 'measure' else ''}] "
                      f"{res['seconds']:.1f} s  (t={time.perf_counter() - t_run:.0f} s)", flush=True)
                results["skipped"].update(sched.skipped)
                results["findings"] = findings(rows, args)
                results["stages_s"] = timer.stages
                results["jobs"] = sched.timeline
                save(results)
    finally:
        sched.close()
    results["skipped"].update(sched.skipped)
    results["findings"] = findings(rows, args)
    results["jobs"] = sched.timeline
    results["stages_s"] = timer.stages
    return results


def draft_row(d: dict[str, Any], res: dict[str, Any], category_of: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """Return a draft's JSON entry: run.py's keys (measured ones filled in when measured), the arm,
    seed and regime, the per-epoch curve and the best epoch."""
    best = dict(res["best"])
    return {
        "arm": d["arm"], "seed": d["seed"], "size": d["size"], "fraction": d["fraction"], "variant": d["variant"] or None,
        "samples": len(d["ids"]), "category_samples": dict(Counter(category_of[i] for i in d["ids"])),
        "epochs": args.epochs, "batch_size": args.batch, "train_steps": res["train_steps"],
        "steps_per_epoch": res["per_epoch"], "stopped_at_epoch": best.get("epoch"),
        "measured": {}, "measured_weighted": None, "measured_overall": None,
        "simulated": res["simulated"], "simulated_weighted": res["simulated_weighted"],
        "eval_prompts": 0, "curve": res["curve"],
        "best": {"epoch": best.get("epoch"), "steps": best.get("steps"), "simulated": best.get("simulated"),
                 "simulated_weighted": best.get("simulated_weighted"), "measured": None, "measured_weighted": None},
        "train_s": res["seconds"], "train_tokens_per_s": res["train_tokens_per_s"],
    }


def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 4)


# ---------------------------------------------------------------- findings

FIGURES = {"measured_end": ("measured_weighted", False), "simulated_end": ("simulated_weighted", False),
           "simulated_best": ("simulated_weighted", True), "measured_best": ("measured_weighted", True)}


def _value(row: dict[str, Any], figure: str) -> float | None:
    key, best = FIGURES[figure]
    return (row.get("best") or {}).get(key) if best else row.get(key)


def spread(values: list[float]) -> dict[str, Any]:
    """Return mean, sample standard deviation, min, max and n of `values`."""
    if not values:
        return {"n": 0}
    return {"mean": round(statistics.fmean(values), 4), "sd": round(statistics.stdev(values), 4) if len(values) > 1 else None,
            "min": round(min(values), 4), "max": round(max(values), 4), "n": len(values)}


def cells(rows: dict[str, Any], figure: str) -> dict[str, dict[int, dict[str, Any]]]:
    """Return {arm: {size: spread over seeds}} of a figure, for the full-size drafts without a variant."""
    out: dict[str, dict[int, list[float]]] = {}
    for row in rows.values():
        if row.get("variant") or row.get("fraction", 1) != 1:
            continue
        v = _value(row, figure)
        if v is not None:
            out.setdefault(row["arm"], {}).setdefault(row["size"], []).append(v)
    return {arm: {n: spread(vs) for n, vs in sorted(by.items())} for arm, by in out.items()}


def efficiency(table: dict[str, dict[int, dict[str, Any]]], small: int, large: int) -> dict[str, Any]:
    """Return the data-efficiency ratio of the matched arm against each other arm, on seed means.

    `other_samples_matching_matched_small`: how many samples of the other arm reach the matched
    small draft's figure, on the other arm's log-linear curve through its two sizes (an answer past
    the large size is an extrapolation, flagged); `ratio` = that / small. `matched_samples_matching_
    other_large`: the same read the other way, on the matched curve, and `ratio_at_large` = large /
    that."""
    m = table.get("matched", {})
    out: dict[str, Any] = {}
    if small not in m or large not in m or "mean" not in m[small] or "mean" not in m[large]:
        return out
    ms, ml = m[small]["mean"], m[large]["mean"]
    for arm, by in table.items():
        if arm == "matched" or small not in by or large not in by or "mean" not in by[small] or "mean" not in by[large]:
            continue
        os_, ol = by[small]["mean"], by[large]["mean"]
        entry: dict[str, Any] = {"matched_small_minus_other_small": round(ms - os_, 4),
                                 "matched_small_minus_other_large": round(ms - ol, 4),
                                 "matched_large_minus_other_large": round(ml - ol, 4)}
        if ol > os_:
            b = (ol - os_) / math.log(large / small)
            n = small * math.exp((ms - os_) / b)
            entry.update(other_samples_matching_matched_small=round(n), ratio=round(n / small, 2),
                         extrapolated=not small <= n <= large)
        else:
            entry.update(ratio=None, why="the other arm's curve does not rise between its two sizes")
        if ml > ms:
            bm = (ml - ms) / math.log(large / small)
            nm = small * math.exp((ol - ms) / bm)
            entry.update(matched_samples_matching_other_large=round(nm), ratio_at_large=round(large / nm, 2),
                         extrapolated_at_large=not small <= nm <= large)
        out[arm] = entry
    return out


def findings(rows: dict[str, Any], args: Any) -> dict[str, Any]:
    """Return the cells (mean and spread over seeds), the data-efficiency ratios and the variants'
    figures, for each figure (measured / simulated, at the equal-epoch end and at the best epoch)."""
    small, large = (args["sizes"] if isinstance(args, dict) else args.sizes)
    out: dict[str, Any] = {}
    for figure in FIGURES:
        table = cells(rows, figure)
        out[figure] = {"cells": {a: {str(n): v for n, v in by.items()} for a, by in table.items()},
                       "efficiency": efficiency(table, small, large)}
    per_cat: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows.values():
        if row.get("variant") or row.get("fraction", 1) != 1:
            continue
        for key in ("measured", "simulated"):
            for cat, v in (row.get(key) or {}).items():
                per_cat.setdefault(f"{row['arm']}-{row['size']}", {}).setdefault(key, {}).setdefault(cat, []).append(v)
    out["per_category"] = {cell: {k: {c: spread(vs) for c, vs in sorted(by.items())} for k, by in d.items()}
                           for cell, d in sorted(per_cat.items())}
    out["stopped_at_epoch"] = {cell: spread([r["stopped_at_epoch"] for r in rows.values()
                                             if f"{r['arm']}-{r['size']}" == cell and not r.get("variant")
                                             and r.get("fraction", 1) == 1 and r.get("stopped_at_epoch") is not None])
                               for cell in sorted({f"{r['arm']}-{r['size']}" for r in rows.values()})}
    variants: dict[str, Any] = {}
    # the variants' seed (the first seed of the run that trained them): "plain" is the matched draft of that seed
    v_seeds = {r["seed"] for r in rows.values() if r.get("variant")}
    v_seed = min(v_seeds) if v_seeds else (args["seeds"] if isinstance(args, dict) else args.seeds)[0]
    for tag, row in rows.items():
        if row.get("arm") == "matched" and row.get("fraction", 1) == 1 and row.get("seed") == v_seed:
            name = row.get("variant") or "plain"
            variants.setdefault(str(row["size"]), {})[name] = {
                "measured_weighted": row.get("measured_weighted"), "simulated_weighted": row.get("simulated_weighted"),
                "best_simulated_weighted": row["best"].get("simulated_weighted"), "stopped_at_epoch": row.get("stopped_at_epoch"),
                "measured": row.get("measured"), "simulated": row.get("simulated")}
    out["variants"] = variants
    return out


# ---------------------------------------------------------------- the command

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="/tmp/curator-reference-fair")
    p.add_argument("--out", default=None, help="also write the results JSON here (after every stage and job)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="toy sizes for a CPU smoke run")
    p.add_argument("--target-seconds", type=float, default=75.0)
    p.add_argument("--target-steps", type=int, default=None)
    p.add_argument("--domain-bytes", type=int, default=20_000_000, help="text per domain")
    p.add_argument("--prose-bytes-factor", type=int, default=2, help="prose reads this many times --domain-bytes")
    p.add_argument("--prose-pool", type=int, default=12000, help="prose candidates (the generic arm is all chat)")
    p.add_argument("--prose-density", type=int, default=4, help="prose pool windows cut this much more densely")
    p.add_argument("--traffic-share", type=float, default=0.1)
    p.add_argument("--traffic-density", type=int, default=2)
    p.add_argument("--target-pairs-per-domain", type=int, default=40_000)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--target-batch", type=int, default=128)
    p.add_argument("--prefix-tokens", type=int, default=64)
    p.add_argument("--cont-tokens", type=int, default=64)
    p.add_argument("--pool-per-domain", type=int, default=4000)
    p.add_argument("--traffic", type=int, default=2000, help="traffic requests in all")
    p.add_argument("--heldout-share", type=float, default=0.5)
    p.add_argument("--sizes", default="2000,8000")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--fractions", default="0.125,0.25,0.5", help="the matched small mix's nested subsets (seed 0)")
    p.add_argument("--variants", default="", help="EAGLE-3.1 norm variants on the matched mixes, seed 0 "
                   "(bench/eagle31_variants.py VARIANTS, comma-separated)")
    p.add_argument("--variant-sizes", default="", help="the sizes the variants train at (default: --sizes)")
    p.add_argument("--train-first", action="store_true",
                   help="train every draft (seeds, then variants) before measuring any (greedy pass included)")
    p.add_argument("--gen-batch", type=int, default=512)
    p.add_argument("--ttt-steps", type=int, default=4)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-per-category", type=int, default=48)
    p.add_argument("--eval-new-tokens", type=int, default=32)
    p.add_argument("--workers", type=int, default=8, help="processes training and measuring drafts side by side")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    p.add_argument("--guess-train-s", type=float, default=30.0, help="a small draft's training time before one is seen")
    p.add_argument("--guess-measure-s", type=float, default=90.0, help="a measurement's time before one is seen")
    p.add_argument("--stop-after-s", type=float, default=None, help="start no job that would end past this many seconds")
    p.add_argument("--build-workers", type=int, default=6)
    p.add_argument("--findings-from", default=None, help="print the findings of a saved run's JSON")
    p.add_argument("--combine", nargs="+", default=None, metavar="RUN_JSON",
                   help="with --out: one JSON of several runs' drafts, refused unless their targets, profiles and "
                        "mixes are the same (weights hash, shares, per-domain rows)")
    args = p.parse_args(argv)
    if args.tiny:
        args.target_seconds, args.domain_bytes, args.vocab, args.hidden, args.layers = 3.0, 150_000, 384, 64, 4
        args.target_pairs_per_domain, args.target_batch, args.prefix_tokens, args.cont_tokens = 200, 8, 16, 8
        args.pool_per_domain, args.prose_pool, args.traffic, args.sizes, args.traffic_share = 40, 60, 160, "24,48", 0.2
        args.gen_batch, args.epochs, args.batch, args.eval_per_category, args.eval_new_tokens = 32, 2, 4, 2, 6
        args.build_workers, args.fractions, args.seeds = 0, "0.5", "0,1"
        args.guess_train_s, args.guess_measure_s = 5.0, 5.0
    args.sizes = [int(x) for x in str(args.sizes).split(",")] if isinstance(args.sizes, str) else args.sizes
    args.seeds = [int(x) for x in str(args.seeds).split(",")] if isinstance(args.seeds, str) else args.seeds
    args.arms = [a for a in str(args.arms).split(",") if a] if isinstance(args.arms, str) else args.arms
    args.fractions = [float(x) for x in str(args.fractions).split(",") if x] if isinstance(args.fractions, str) else args.fractions
    args.variants = [v for v in str(args.variants).split(",") if v] if isinstance(args.variants, str) else args.variants
    args.variant_sizes = ([int(x) for x in str(args.variant_sizes).split(",") if x]
                          if isinstance(args.variant_sizes, str) else args.variant_sizes)
    unknown = set(args.arms) - set(ARMS)
    if unknown:
        p.error(f"unknown arms {sorted(unknown)} (known: {', '.join(ARMS)})")
    if args.variants:
        from bench.eagle31_variants import VARIANTS

        bad = [v for v in args.variants if v not in VARIANTS or v == "plain"]
        if bad:
            p.error(f"unknown variants {bad} (known: {', '.join(v for v in VARIANTS if v != 'plain')}; "
                    "plain is the matched draft itself)")
    return args


def print_tables(results: dict[str, Any]) -> None:
    """Print the cells (mean +- sd over seeds) and the efficiency ratios of each figure."""
    f = results.get("findings") or {}
    for figure in FIGURES:
        table = (f.get(figure) or {}).get("cells") or {}
        print(f"{figure}:")
        for arm, by in table.items():
            print("  " + arm.ljust(8) + "  ".join(
                f"{n}: {v.get('mean', float('nan')):.3f} +- {v.get('sd') or 0:.3f} (n={v['n']})" for n, v in by.items()))
        for arm, e in ((f.get(figure) or {}).get("efficiency") or {}).items():
            print(f"  matched vs {arm}: ratio {e.get('ratio')} (extrapolated: {e.get('extrapolated')}), "
                  f"at large {e.get('ratio_at_large')}")
    for size, by in (f.get("variants") or {}).items():
        for name, v in by.items():
            print(f"variant {size} {name}: measured {v['measured_weighted']} simulated {v['simulated_weighted']} "
                  f"best {v['best_simulated_weighted']}")
    if results.get("skipped"):
        print("skipped:", json.dumps(results["skipped"]))


def combine(paths: list[str]) -> dict[str, Any]:
    """Return one run's JSON holding the drafts of `paths` (runs of the same set-up: the same target
    weights, profile and mixes, which is checked), each draft tagged with the run it came from."""
    runs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    base = runs[0]
    out = {**base, "drafts": {}, "skipped": {}, "combined_from": []}
    for path, run in zip(paths, runs):
        same = {"target": run["target"]["weights_sha256"] == base["target"]["weights_sha256"],
                "profile": run["profile"] == base["profile"], "data": run["data"] == base["data"],
                "mixes": all(run["mixes"][k]["domains"] == base["mixes"][k]["domains"]
                             for k in run["mixes"] if k in base["mixes"])}
        if not all(same.values()):
            raise SystemExit(f"{path} is not the same set-up as {paths[0]}: {same}")
        clash = set(run["drafts"]) & set(out["drafts"])
        if clash:
            raise SystemExit(f"{path} repeats drafts {sorted(clash)}")
        out["drafts"].update({t: {**r, "run": Path(path).name} for t, r in run["drafts"].items()})
        out["skipped"].update({f"{Path(path).name}:{k}": v for k, v in run.get("skipped", {}).items()})
        out["combined_from"].append({"file": Path(path).name, "settings": run["settings"], "total_s": run.get("total_s"),
                                     "elapsed_s": run.get("elapsed_s"), "partial": run.get("partial", False),
                                     "stages_s": run.get("stages_s"), "jobs": run.get("jobs")})
    # a draft one run skipped and another trained is not missing
    out["skipped"] = {k: v for k, v in out["skipped"].items()
                      if not (k.split(":")[1] == "train" and k.split(":")[2] in out["drafts"])}
    out["settings"] = {**base["settings"], "seeds": sorted({r["seed"] for r in out["drafts"].values()}),
                       "arms": sorted({r["arm"] for r in out["drafts"].values()})}
    out.pop("partial", None)
    out["findings"] = findings(out["drafts"], out["settings"])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.combine:
        from training.io.atomic import write_text

        combined = combine(args.combine)
        if args.out:
            write_text(args.out, json.dumps(combined, default=str) + "\n")
        print_tables(combined)
        return 0
    if args.findings_from:
        saved = json.loads(Path(args.findings_from).read_text(encoding="utf-8"))
        saved["findings"] = findings(saved["drafts"], saved["settings"])
        print_tables(saved)
        print(json.dumps(saved["findings"], indent=1))
        return 0
    results = run_saving(args, run, default=str)
    print_tables(results)
    write_results(args, results, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
