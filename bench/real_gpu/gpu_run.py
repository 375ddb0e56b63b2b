"""Issue 50 on the device: does curation pay on a real model? SmolLM2-135M-Instruct, real prompts.

Runs where only torch, transformers, safetensors and numpy are installed (plus the pure-Python gguf
wheel for stage A): it imports this repo's training/, curator/targets/convert.py and curator.forecast,
never curator's CLI or its heavy dependencies (tests/bench: bench/real_gpu/test_dry_run.py checks).

    A  target    reassemble the GGUF from its two parts, convert it to a Hugging Face folder
    B  generate  the target's greedy answers to every prompt of the arms' union (once: every arm
                 uses the target's own answers at equal target inference) and to the held-out traffic;
                 batched HF generate, left padding; tokens/s measured. Then the held-out states
                 (the simulated figure's store).
    C  train     an EAGLE-3 draft per arm x size x seed, the same epochs each, states computed online
                 by the target beside the draft (TrainConfig.online); most important first
    D  measure   real speculative decoding (training.eval.evaluate, K=3) of each draft on the held-out
                 traffic, per category and traffic-weighted, beside the simulated figure
    E  forecast  fitted on the matched drafts of <= 2K samples, its prediction for the largest one

Every stage resumes from --work (a later call on the same warm machine, or the same folder) and stops
starting work that its time so far says would end past --stop-after-s: what was not run is listed
under `not_run`, never filled in. Results go to --out/results.json after every job.

    python3 bench/real_gpu/gpu_run.py --data .whl/real_gpu --work /tmp/real_gpu --out $OUT --stop-after-s 540
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from training.io.atomic import write_text  # noqa: E402
from training.records.gen_record import RECORD_FORMAT  # noqa: E402
from training.records.gen_shards import shard_name, shard_paths  # noqa: E402

ARMS = ("sharegpt-only", "hand", "matched")
FRACTIONS = (0.125, 0.25, 0.5)  # the forecast's small drafts: nested subsets of the matched 2K mix


def _r(v: float | None, n: int = 4) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, n)


def load_data(data: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    prompts = {}
    with gzip.open(data / "prompts.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            prompts[row["id"]] = row
    return prompts, json.loads((data / "plan.json").read_text(encoding="utf-8"))


class Results:
    """The results JSON, written whole (atomically) to --out after every change."""

    def __init__(self, path: Path, work: Path) -> None:
        self.path, self.keep = path, work / "results.json"
        self.data: dict[str, Any] = json.loads(self.keep.read_text()) if self.keep.is_file() else {}
        self.data.setdefault("drafts", {})
        self.data.setdefault("calls", [])

    def save(self) -> None:
        text = json.dumps(self.data, indent=1, sort_keys=True)
        write_text(self.keep, text)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text(self.path, text)


# ---------------------------------------------------------------- A: the target

def stage_a(args: argparse.Namespace, res: Results) -> None:
    target = args.work / "target"
    if (target / "config.json").is_file():
        return
    t0 = time.perf_counter()
    gguf = args.work / "model.gguf"
    if not gguf.is_file():
        parts = [args.gguf_part1 if args.gguf_part1.is_file() else args.data / "gguf.part1", args.data / "gguf.part2"]
        missing = [str(p) for p in parts if not p.is_file()]
        if missing:
            raise SystemExit(f"gpu_run: stage A needs both GGUF parts; missing: {', '.join(missing)}")
        tmp = gguf.with_suffix(".part")
        with open(tmp, "wb") as out:
            for p in parts:
                out.write(p.read_bytes())
        os.replace(tmp, gguf)
    from curator.targets.convert import gguf_to_folder

    expected = (res.data.get("plan_gguf") or {}).get("bytes")
    if expected and gguf.stat().st_size != expected:
        raise SystemExit(f"gpu_run: the reassembled GGUF has {gguf.stat().st_size} bytes, the plan says {expected}")
    gguf_to_folder(gguf, target, dtype="float32")
    res.data["stage_a"] = {"seconds": round(time.perf_counter() - t0, 1), "gguf_bytes": gguf.stat().st_size}
    res.save()


# ---------------------------------------------------------------- B: the target's answers

def generation_order(plan: dict[str, Any], max_size: int | None = None) -> list[str]:
    """The prompts to answer, most needed first: held-out, then the 2K cells, 8K cells, the largest
    (only the cells of at most `max_size` samples: a call too short for all answers every cell it trains)."""
    order: list[str] = [i for ids in plan["heldout"].values() for i in ids]
    for n in sorted((n for n in plan["sizes"] if max_size is None or int(n) <= max_size), key=int):
        for arm in ARMS:
            order += plan["arms"][arm].get(str(n), [])
    seen: set[str] = set()
    return [i for i in order if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


def answers(gen_dir: Path, want: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """id -> record, for every readable record in the shards (the trainer's own reader: lines split
    at "\\n" only, where str.splitlines() cut records holding a raw U+2028 in two on the H100 run; a
    line cut by a killed call is skipped and answered again)."""
    from training.records.chat_tokens import iter_generation

    if not shard_paths(gen_dir):
        return {}
    return {rec["id"]: rec for rec in iter_generation(gen_dir) if want is None or rec["id"] in want}


def done_ids(gen_dir: Path) -> set[str]:
    return set(answers(gen_dir))


def stage_b(args: argparse.Namespace, res: Results, prompts: dict[str, dict[str, Any]], plan: dict[str, Any],
            deadline: float) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    held = {i for ids in plan["heldout"].values() for i in ids}
    gen_dirs = {"heldout": args.work / "gen-heldout", "pool": args.work / "gen-pool"}
    for d in gen_dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    have = done_ids(gen_dirs["heldout"]) | done_ids(gen_dirs["pool"])
    todo = [i for i in generation_order(plan, args.gen_max_size) if i in prompts and i not in have]
    info = res.data.setdefault("stage_b", {"output_tokens": 0, "seconds": 0.0, "answered": 0, "too_long": 0})
    if todo:
        dev = args.device
        tok = AutoTokenizer.from_pretrained(str(args.work / "target"))
        tok.padding_side = "left"
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
        model = AutoModelForCausalLM.from_pretrained(str(args.work / "target"), dtype=dtype).to(dev).eval()
        gen_eos = model.generation_config.eos_token_id
        eos = {tok.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])} - {None}
        encoded: list[tuple[str, list[int]]] = []
        for sid in todo:
            text = tok.apply_chat_template(prompts[sid]["messages"], tokenize=False, add_generation_prompt=True)
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            if len(ids) > args.max_prompt_tokens:
                info["too_long"] += 1
                res.data.setdefault("too_long_ids", []).append(sid)
                continue
            encoded.append((sid, ids))
        # priority chunks (held-out first), each sorted by length inside so a batch pads little
        chunk = args.gen_batch * 8
        t_step = None
        shard = len(shard_paths(gen_dirs["pool"])) + len(shard_paths(gen_dirs["heldout"]))
        for c0 in range(0, len(encoded), chunk):
            part = sorted(encoded[c0: c0 + chunk], key=lambda e: len(e[1]))
            for b0 in range(0, len(part), args.gen_batch):
                batch = part[b0: b0 + args.gen_batch]
                if t_step is not None and time.perf_counter() + t_step > deadline:
                    res.data.setdefault("not_run", {})["generate"] = (
                        f"{len(encoded) - info['answered']} prompts not answered for want of time")
                    res.save()
                    return
                t0 = time.perf_counter()
                width = max(len(ids) for _, ids in batch)
                input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for i, (_, ids) in enumerate(batch):
                    input_ids[i, width - len(ids):] = torch.tensor(ids)
                    mask[i, width - len(ids):] = 1
                with torch.no_grad():
                    out = model.generate(input_ids=input_ids.to(dev), attention_mask=mask.to(dev), do_sample=False,
                                         max_new_tokens=args.gen_new_tokens, pad_token_id=pad, temperature=None,
                                         top_p=None, top_k=None)
                new = out[:, width:].tolist()
                lines: dict[str, list[str]] = {"heldout": [], "pool": []}
                for (sid, ids), comp in zip(batch, new, strict=True):
                    cut = next((k + 1 for k, t in enumerate(comp) if t in eos), None)
                    comp = comp[:cut] if cut else [t for t in comp if t != pad] or comp[:1]
                    info["output_tokens"] += len(comp)
                    p = prompts[sid]
                    msgs = [{**m, "train": False} for m in p["messages"]]
                    answer = tok.decode(comp, skip_special_tokens=True)
                    msgs.append({"role": "assistant", "content": answer, "train": True})
                    rec = {"format": RECORD_FORMAT, "id": sid, "source": p.get("source", ""), "category": p["category"],
                           "turns": "all", "model": "SmolLM2-135M-Instruct", "mode": "token", "messages": msgs,
                           "generations": [{"message": len(msgs) - 1, "prompt_ids": ids, "completion_ids": comp}]}
                    lines["heldout" if sid in held else "pool"].append(json.dumps(rec, ensure_ascii=False) + "\n")
                for name, ls in lines.items():
                    if ls:
                        write_text(gen_dirs[name] / shard_name(shard), "".join(ls))
                        shard += 1
                dt = time.perf_counter() - t0
                t_step = max(dt, t_step or 0.0)
                info["answered"] += len(batch)
                info["seconds"] = round(info["seconds"] + dt, 2)
                info["output_tokens_per_s"] = round(info["output_tokens"] / max(info["seconds"], 1e-9))
                print(f"[generate] {info['answered']}/{len(encoded)}  {info['output_tokens_per_s']} tok/s", flush=True)
                res.save()
        del model
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
    res.data.get("not_run", {}).pop("generate", None)
    states = args.work / "states-heldout"
    if "heldout_states" not in info:  # a store a killed call left half-written is captured again
        import shutil

        from training.capture import hidden_states

        shutil.rmtree(states, ignore_errors=True)
        t0 = time.perf_counter()
        hs = hidden_states.run(args.work / "target", gen_dirs["heldout"], states, dtype="bf16")
        info["heldout_states"] = {"tokens": hs.tokens, "seconds": round(time.perf_counter() - t0, 1)}
    res.save()


# ---------------------------------------------------------------- C and D: jobs in worker processes

_CTX: dict[str, Any] = {}


def _init(ctx: dict[str, Any]) -> None:
    _CTX.update(ctx)
    torch.set_num_threads(ctx["threads"])
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "2")


def _target() -> tuple[Any, Any]:
    if "target" not in _CTX:
        from training.eval.evaluate import load_target

        _CTX["target"] = load_target(_CTX["work"] + "/target", device=_CTX["device"], dtype=torch.float32)
    return _CTX["target"]


def train_job(tag: str, ids: list[str], seed: int) -> dict[str, Any]:
    """Train one draft online (the target computes its states beside it); return its row's figures."""
    from training.train.config import TrainConfig
    from training.train.trainer import train

    c, w = _CTX, Path(_CTX["work"])
    t0 = time.perf_counter()
    view = w / "views" / tag
    view.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(rec, ensure_ascii=False) + "\n" for rec in answers(w / "gen-pool", set(ids)).values()]
    write_text(view / shard_name(0), "".join(lines))
    batch = min(c["batch"], len(lines))
    per_epoch = max(1, len(lines) // batch)
    cfg = TrainConfig(data=str(view), online=True, eval_data=str(w / "states-heldout"), target=str(w / "target"),
                      out=str(w / "runs" / tag), draft_vocab_size=c["vocab"], ttt_steps=c["ttt_steps"], lr=c["lr"],
                      warmup_ratio=0.03, global_batch_size=batch, micro_batch_size=batch, epochs=float(c["epochs"]),
                      max_steps=c["max_steps"], max_length=c["max_length"], eval_max_samples=None,
                      log_every=max(1, per_epoch // 4), eval_every=0, save_every=0, device=c["device"], seed=seed)
    result = train(cfg)
    sim = {k: round(v, 4) for k, v in (result.eval.get("sim_categories") or {}).items()}
    return {"tag": tag, "samples": len(lines), "train_steps": result.step, "steps_per_epoch": per_epoch,
            "batch_size": batch, "simulated": sim, "checkpoint": str(result.checkpoint),
            "train_tokens_per_s": round(result.train.get("tokens_per_s", 0.0)), "train_s": round(time.perf_counter() - t0, 1)}


def greedy_job(ids: list[str]) -> dict[str, Any]:
    """The target's greedy decode of some held-out prompts: every draft's measurement checks against it."""
    from training.eval.decode import greedy_decode
    from training.eval.evaluate import eos_token_ids
    from training.eval.prompts import render_prompt

    target, tok = _target()
    eos = eos_token_ids(target, tok)
    return {"greedy": {sid: asdict(greedy_decode(target, render_prompt(tok, _CTX["eval"][sid]["messages"]),
                                                 _CTX["eval_new_tokens"], eos)) for sid in ids}}


def measure_job(tag: str, checkpoint: str, greedy: dict[str, Any]) -> dict[str, Any]:
    from training.eagle3.load import load_draft
    from training.eval.decode import GreedyResult
    from training.eval.evaluate import evaluate
    from training.eval.prompts import EvalPrompt
    from training.eval.proposers import DraftProposer
    from training.eval.simulate import traffic_weighted
    from training.export.export import export_checkpoint

    c, w = _CTX, Path(_CTX["work"])
    t0 = time.perf_counter()
    export = w / "exports" / tag
    export_checkpoint(checkpoint, export, fmt="sglang", target_dir=w / "target")
    target, tok = _target()
    cuda = c["device"].startswith("cuda")
    model = load_draft(export, w / "target").to(torch.bfloat16 if cuda else torch.float32).to(c["device"])
    prompts = [EvalPrompt(id=sid, messages=p["messages"], category=p["category"]) for sid, p in c["eval"].items()]
    report = evaluate(target, tok, DraftProposer(model), prompts, steps=c["ttt_steps"], max_new_tokens=c["eval_new_tokens"],
                      tie_margin=1e-2 if cuda else 1e-4, greedy={sid: GreedyResult(**g) for sid, g in greedy.items()})
    measured = {k: round(s.acceptance_length, 4) for k, s in report.categories.items() if s.forwards}
    return {"tag": tag, "measured": measured,
            "measured_weighted": _r(traffic_weighted(report.categories, c["weights"])["acceptance_length"]),
            "measured_overall": round(report.overall.acceptance_length, 4), "eval_prompts": len(report.prompts),
            "eval_prompts_per_category": dict(Counter(r.category for r in report.prompts)), "greedy_ties": report.ties,
            "spec_s": round(report.spec_s, 2), "new_tokens": report.new_tokens, "measure_s": round(time.perf_counter() - t0, 1)}


def draft_plan(args: argparse.Namespace, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every draft, most important first: seed 0 at 2K and 8K, the forecast's subsets, the largest
    size, then seeds 1 and 2 (the brief's order: the cells, the seeds, the largest)."""
    from curator import forecast as fc

    sizes = sorted(int(n) for n in plan["sizes"])
    small, mid, large = sizes[0], sizes[1], sizes[-1]
    out: list[dict[str, Any]] = []
    for n in (small, mid):
        for arm in ARMS:
            out.append({"tag": f"{arm}-{n}-s0", "arm": arm, "size": n, "seed": 0, "ids": plan["arms"][arm][str(n)]})
    by_cat: dict[str, list[str]] = {}
    for sid in plan["arms"]["matched"][str(small)]:
        by_cat.setdefault(plan["category_of"][sid], []).append(sid)
    for frac, ids in fc.nested_subsets(by_cat, list(FRACTIONS), seed=0).items():
        out.append({"tag": f"matched-{small}-x{frac:g}-s0", "arm": "matched", "size": small, "seed": 0, "ids": ids,
                    "fraction": frac})
    for seed in args.seeds[1:]:
        for n in (small, mid):
            for arm in ARMS:
                out.append({"tag": f"{arm}-{n}-s{seed}", "arm": arm, "size": n, "seed": seed, "ids": plan["arms"][arm][str(n)]})
        if seed == args.seeds[1] and large > mid:
            for arm in ARMS:
                out.append({"tag": f"{arm}-{large}-s0", "arm": arm, "size": large, "seed": 0, "ids": plan["arms"][arm][str(large)]})
    if len(args.seeds) < 2 and large > mid:
        for arm in ARMS:
            out.append({"tag": f"{arm}-{large}-s0", "arm": arm, "size": large, "seed": 0, "ids": plan["arms"][arm][str(large)]})
    return out


def stage_cd(args: argparse.Namespace, res: Results, prompts: dict[str, dict[str, Any]], plan: dict[str, Any],
             deadline: float, stages: str) -> None:
    """Train (C) and measure (D) on --workers processes sharing the GPU, most important first; no job
    starts that the slowest of its kind so far (per sample for training) says would end past the deadline."""
    w = args.work
    answered = done_ids(w / "gen-pool")
    too_long = set(res.data.get("too_long_ids") or [])
    held = [i for ids in plan["heldout"].values() for i in [j for j in ids if j not in too_long][: args.eval_per_category]]
    eval_rows = {sid: prompts[sid] for sid in held}
    weights = plan["traffic_weights"]
    ctx = {"work": str(w), "device": args.device, "threads": args.threads, "vocab": args.vocab, "ttt_steps": args.ttt_steps,
           "lr": args.lr, "batch": args.batch, "epochs": args.epochs, "max_steps": args.max_steps,
           "max_length": args.max_length, "eval": eval_rows, "eval_new_tokens": args.eval_new_tokens, "weights": weights}
    drafts: dict[str, Any] = res.data["drafts"]
    not_run: dict[str, str] = res.data.setdefault("not_run", {})
    todo_train = []
    for d in draft_plan(args, plan):
        if d["tag"] in drafts and drafts[d["tag"]].get("checkpoint") and Path(drafts[d["tag"]]["checkpoint"]).exists():
            continue
        # a prompt longer than --max-prompt-tokens is left out of every arm alike (counted in stage_b)
        d["ids"] = [i for i in d["ids"] if i not in too_long]
        missing = [i for i in d["ids"] if i not in answered]
        # A few unanswered prompts (a generation cut by the deadline) cost a draft 1% of its samples at
        # most, counted in its row; more than that and the draft waits for the answers.
        if len(missing) > len(d["ids"]) // 100:
            not_run[f"train:{d['tag']}"] = f"{len(missing)} of its {len(d['ids'])} prompts have no answer yet"
            continue
        not_run.pop(f"train:{d['tag']}", None)
        d["unanswered"] = len(missing)
        d["ids"] = [i for i in d["ids"] if i in answered]
        todo_train.append(d)
    pool = ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=_init, initargs=(ctx,))
    slow: dict[str, float] = {"train_per_sample": args.guess_train_s_per_sample, "measure": args.guess_measure_s,
                              "greedy": args.guess_measure_s}
    running: dict[Future, tuple[str, dict[str, Any], float]] = {}
    greedy_path = w / "greedy.json"  # JSON, not a pickle: nothing here is loaded with torch.load
    greedy: dict[str, Any] | None = json.loads(greedy_path.read_text(encoding="utf-8")) if greedy_path.is_file() else None
    greedy_pending = greedy is None and "D" in stages
    if greedy_pending:
        shards = [held[k:: args.workers] for k in range(args.workers)]
        for part in shards:
            if part:
                running[pool.submit(run_timed, "greedy", part)] = ("greedy", {"ids": part}, time.perf_counter())
        greedy = {}

    def measure_queue() -> list[tuple[str, str]]:
        if "D" not in stages:
            return []
        return [(t, r["checkpoint"]) for t, r in drafts.items()
                if r.get("checkpoint") and r.get("measured_weighted") is None and f"measure:{t}" not in queued]

    queued: set[str] = set()
    try:
        while True:
            now = time.perf_counter()
            while len(running) < args.workers:
                started = False
                if "D" in stages and not greedy_pending:
                    for t, ck in measure_queue():
                        if now + slow["measure"] > deadline:
                            not_run[f"measure:{t}"] = "not started: too little time left"
                            queued.add(f"measure:{t}")
                            continue
                        queued.add(f"measure:{t}")
                        not_run.pop(f"measure:{t}", None)
                        running[pool.submit(run_timed, "measure", t, ck, greedy)] = ("measure", {"tag": t}, now)
                        started = True
                        break
                if not started and "C" in stages and todo_train:
                    d = todo_train.pop(0)
                    est = slow["train_per_sample"] * len(d["ids"]) * args.epochs
                    if now + est > deadline:
                        not_run[f"train:{d['tag']}"] = f"not started: {deadline - now:.0f} s left, it takes ~{est:.0f} s"
                        continue
                    not_run.pop(f"train:{d['tag']}", None)
                    running[pool.submit(run_timed, "train", d["tag"], d["ids"], d["seed"])] = ("train", d, now)
                    started = True
                if not started:
                    break
            if not running:
                break
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                kind, d, t0 = running.pop(fut)
                dt = time.perf_counter() - t0
                exc = fut.exception()
                if exc is not None:
                    key = f"{kind}:{d.get('tag', 'eval-prompts')}"
                    not_run[key] = f"failed: {type(exc).__name__}: {exc}"
                    print(f"[{key}] FAILED {type(exc).__name__}: {exc}", flush=True)
                    if kind == "greedy":
                        greedy_pending = False
                        stages = stages.replace("D", "")
                    continue
                out = fut.result()
                if kind == "greedy":
                    assert greedy is not None
                    greedy.update(out["greedy"])
                    slow["greedy"] = max(slow["greedy"], dt)
                    if not any(k == "greedy" for k, _, _ in running.values()):
                        greedy_pending = False
                        write_text(greedy_path, json.dumps(greedy))
                        res.data["greedy_s"] = round(dt, 1)
                elif kind == "train":
                    slow["train_per_sample"] = max(slow["train_per_sample"] if "trained" in slow else 0.0,
                                                   dt / max(1, len(d["ids"]) * args.epochs))
                    slow["trained"] = 1.0
                    cats = Counter(plan["category_of"][i] for i in d["ids"])
                    drafts[d["tag"]] = {"arm": d["arm"], "size": d["size"], "seed": d["seed"],
                                        "fraction": d.get("fraction", 1.0), "category_samples": dict(cats),
                                        "unanswered": d.get("unanswered", 0),
                                        "epochs": args.epochs, "measured": {}, "measured_weighted": None,
                                        **out, "simulated_weighted": weighted(out["simulated"], weights)}
                else:
                    slow["measure"] = max(slow["measure"] if "measured" in slow else 0.0, dt)
                    slow["measured"] = 1.0
                    drafts[d["tag"]].update(out)
                print(f"[{kind} {d.get('tag', '')}] {dt:.1f} s", flush=True)
                res.data["findings"] = findings(drafts)
                res.data["timing_guesses"] = {k: round(v, 4) for k, v in slow.items()}
                res.save()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for d in todo_train:
        not_run.setdefault(f"train:{d['tag']}", "not started: no time left")
    res.data["findings"] = findings(drafts)
    res.save()


def run_timed(kind: str, *a: Any) -> dict[str, Any]:
    """Run one job of `kind` in a worker process (its result crosses back as plain data)."""
    if kind == "train":
        return train_job(*a)
    if kind == "measure":
        return measure_job(*a)
    return greedy_job(*a)


def weighted(per_cat: dict[str, float], weights: dict[str, float]) -> float | None:
    have = {c: w for c, w in weights.items() if c in per_cat}
    total = sum(have.values())
    return _r(sum(per_cat[c] * w for c, w in have.items()) / total) if total else None


def spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"mean": round(statistics.fmean(values), 4), "sd": round(statistics.stdev(values), 4) if len(values) > 1 else None,
            "min": round(min(values), 4), "max": round(max(values), 4), "n": len(values)}


def findings(drafts: dict[str, Any]) -> dict[str, Any]:
    """Per arm and size, the seeds' spread of the measured and simulated traffic-weighted figures."""
    out: dict[str, Any] = {}
    for key in ("measured_weighted", "simulated_weighted"):
        cells: dict[str, dict[str, list[float]]] = {}
        for r in drafts.values():
            if r.get("fraction", 1.0) == 1.0 and r.get(key) is not None:
                cells.setdefault(r["arm"], {}).setdefault(str(r["size"]), []).append(r[key])
        out[key] = {a: {n: spread(v) for n, v in sorted(by.items(), key=lambda kv: int(kv[0]))} for a, by in cells.items()}
    return out


# ---------------------------------------------------------------- E: the forecast

def stage_e(args: argparse.Namespace, res: Results, plan: dict[str, Any]) -> None:
    from bench.reference_multidomain.forecast_check import check

    sizes = sorted(int(n) for n in plan["sizes"])
    saved = {"settings": {"ttt_steps": args.ttt_steps, "batch": args.batch},
             "profile": {"shares": plan["traffic_weights"]},
             "drafts": {t: r for t, r in res.data["drafts"].items() if r.get("seed") == 0}}
    # the largest matched draft's own sample count (a prompt left out as too long makes it a few short)
    large = [r["samples"] for r in saved["drafts"].values()
             if r.get("arm") == "matched" and r.get("size") == sizes[-1] and r.get("fraction", 1.0) == 1.0]
    fit_max = sizes[0]
    if not large:
        # The largest cell not trained (a short call): the brief's check, one size down. Fit on the
        # nested subsets of the smallest matched cell, predict that cell's full draft; said in the JSON.
        subsets = [r["samples"] for r in saved["drafts"].values() if r.get("arm") == "matched" and r.get("fraction", 1.0) < 1.0]
        full = [r["samples"] for r in saved["drafts"].values()
                if r.get("arm") == "matched" and r.get("size") == sizes[0] and r.get("fraction", 1.0) == 1.0]
        res.data.setdefault("not_run", {})["forecast_largest"] = f"the matched {sizes[-1]} draft was not trained"
        if not (subsets and full):
            res.data["not_run"]["forecast"] = f"neither the matched {sizes[-1]} draft nor the {sizes[0]} cell's subsets were trained"
            res.save()
            return
        fit_max, large = max(subsets), full
        res.data["forecast_scope"] = f"fit on the matched {sizes[0]} cell's subsets (<= {fit_max} samples), predicting its full draft"
    try:
        res.data["forecast"] = check(saved, fit_max=fit_max, predict=large[0])
        res.data.get("not_run", {}).pop("forecast", None)
    except (Exception, SystemExit) as exc:  # too few drafts measured yet (check() exits): said, never filled in
        res.data.setdefault("not_run", {})["forecast"] = f"{type(exc).__name__}: {exc}"
    res.save()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="prep.py's output folder")
    ap.add_argument("--gguf-part1", type=Path, default=Path("/tmp/real_gpu/gguf.part1"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/real_gpu"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/real_gpu_out")))
    ap.add_argument("--stages", default="ABCDE")
    ap.add_argument("--stop-after-s", type=float, default=540.0, help="start nothing that would end past this")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--gen-batch", type=int, default=384)
    ap.add_argument("--gen-new-tokens", type=int, default=192)
    ap.add_argument("--gen-max-size", type=int, default=None,
                    help="answer only the prompts of the cells of at most this many samples (default: all)")
    ap.add_argument("--max-prompt-tokens", type=int, default=2048)
    ap.add_argument("--eval-per-category", type=int, default=64)
    ap.add_argument("--eval-new-tokens", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=2304)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--guess-train-s-per-sample", type=float, default=0.004)
    ap.add_argument("--guess-measure-s", type=float, default=90.0)
    ap.add_argument("--tiny", action="store_true", help="CPU dry run: tiny answers, 1 step per draft, 2 seeds")
    args = ap.parse_args(argv)
    if args.tiny:
        args.gen_batch, args.gen_new_tokens, args.eval_per_category, args.eval_new_tokens = 16, 8, 2, 6
        args.max_steps, args.batch, args.vocab, args.workers, args.seeds = 1, 4, 512, 2, [0, 1]
        args.max_prompt_tokens, args.max_length = 384, 512
    t_start = time.perf_counter()
    deadline = t_start + args.stop_after_s
    args.work.mkdir(parents=True, exist_ok=True)
    prompts, plan = load_data(args.data)
    plan["category_of"] = {sid: p["category"] for sid, p in prompts.items()}
    res = Results(args.out / "results.json", args.work)
    res.data["plan_gguf"] = plan.get("gguf")
    res.data["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    res.data["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    res.data["plan"] = {k: plan[k] for k in ("sizes", "traffic_weights", "traffic_rows", "traffic_short", "pool_rows",
                                              "profile_shares", "arm_categories", "union_prompts") if k in plan}
    call = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "stages": args.stages}
    res.data["calls"].append(call)
    res.save()
    for stage in args.stages:
        t0 = time.perf_counter()
        if stage == "A":
            stage_a(args, res)
        elif stage == "B":
            stage_b(args, res, prompts, plan, deadline)
        elif stage == "C" or (stage == "D" and "C" not in args.stages):
            stage_cd(args, res, prompts, plan, deadline, args.stages)
        elif stage == "E":
            stage_e(args, res, plan)
        call[f"stage_{stage}_s"] = round(time.perf_counter() - t0, 1)
        res.save()
    call["total_s"] = round(time.perf_counter() - t_start, 1)
    res.save()
    print(json.dumps({"findings": res.data.get("findings"), "not_run": res.data.get("not_run"),
                      "calls": res.data["calls"][-1]}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
