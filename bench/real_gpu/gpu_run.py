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
    if args.random_target is not None:
        random_target(args.random_target, target)
        res.data["stage_a"] = {"seconds": round(time.perf_counter() - t0, 1), "random_target": True}
        res.save()
        return
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


def random_target(meta: Path, out: Path) -> None:
    """A target of the real one's shape with random weights (its config and tokenizer from `meta`):
    the calibration call times every kind of job on the card before the real GGUF is there. Its
    greedy answers rarely end (no EOS learnt), its draft accepts ~nothing: worst-case timings."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(meta)), dtype=torch.float32)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    for f in meta.iterdir():
        if f.is_file() and not (tmp / f.name).exists():
            shutil.copy(f, tmp / f.name)
    os.replace(tmp, out)


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
    if args.gen_limit is not None:
        todo = todo[: max(0, args.gen_limit - len(have))]
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
    """Train one draft online (the target computes its states beside it), export it for SGLang;
    return its row's figures and its timing split: fixed (start, load, final eval, export) and per
    sample-epoch (the training loop, from the trainer's own log records' clock)."""
    from training.export.export import export_checkpoint
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
    marks: list[tuple[float, int]] = []  # (clock, step) at each training log record

    def on_metrics(record: dict[str, Any]) -> None:
        if record.get("split") == "train":
            marks.append((time.perf_counter(), int(record["step"])))

    result = train(cfg, on_metrics=on_metrics)
    export = w / "exports" / tag
    export_checkpoint(result.checkpoint, export, fmt="sglang", target_dir=w / "target")
    total = time.perf_counter() - t0
    steps = max(1, result.step)
    if len(marks) >= 2 and marks[-1][1] > marks[0][1]:
        per_step = (marks[-1][0] - marks[0][0]) / (marks[-1][1] - marks[0][1])
    else:  # one log record: the whole run counts as training (the conservative split)
        per_step = total / steps
    loop_s = min(total, per_step * steps)
    sim = {k: round(v, 4) for k, v in (result.eval.get("sim_categories") or {}).items()}
    return {"tag": tag, "samples": len(lines), "train_steps": result.step, "steps_per_epoch": per_epoch,
            "batch_size": batch, "simulated": sim, "checkpoint": str(result.checkpoint), "export": str(export),
            "train_tokens_per_s": round(result.train.get("tokens_per_s", 0.0)), "train_s": round(total, 1),
            "timing": {"fixed_s": round(total - loop_s, 2),
                       "s_per_sample_epoch": loop_s / max(1.0, len(lines) * float(c["epochs"]))}}


def greedy_job(ids: list[str]) -> dict[str, Any]:
    """The target's greedy decode of some held-out prompts: every draft's measurement checks against it."""
    from training.eval.decode import greedy_decode
    from training.eval.evaluate import eos_token_ids
    from training.eval.prompts import render_prompt

    t0 = time.perf_counter()
    target, tok = _target()
    t1 = time.perf_counter()
    eos = eos_token_ids(target, tok)
    out = {sid: asdict(greedy_decode(target, render_prompt(tok, _CTX["eval"][sid]["messages"]),
                                     _CTX["eval_new_tokens"], eos)) for sid in ids}
    return {"greedy": out, "timing": {"fixed_s": round(t1 - t0, 2), "s_per_prompt": (time.perf_counter() - t1) / max(1, len(ids))}}


def measure_job(tag: str, export: str, greedy: dict[str, Any], ids: list[str], shard: int) -> dict[str, Any]:
    """One shard of a draft's measurement: real speculative decoding (K = ttt_steps) of `ids`, each
    output checked against the target's greedy decode; per category the histogram of accepted
    tokens per verification forward, which the shards' sums make the draft's whole figure."""
    from training.eagle3.load import load_draft
    from training.eval.decode import GreedyResult
    from training.eval.evaluate import evaluate
    from training.eval.prompts import EvalPrompt
    from training.eagle3.proposer import DraftProposer

    c, w = _CTX, Path(_CTX["work"])
    t0 = time.perf_counter()
    target, tok = _target()
    cuda = c["device"].startswith("cuda")
    model = load_draft(Path(export), w / "target").to(torch.bfloat16 if cuda else torch.float32).to(c["device"])
    prompts = [EvalPrompt(id=sid, messages=c["eval"][sid]["messages"], category=c["eval"][sid]["category"]) for sid in ids]
    t1 = time.perf_counter()
    report = evaluate(target, tok, DraftProposer(model), prompts, steps=c["ttt_steps"], max_new_tokens=c["eval_new_tokens"],
                      tie_margin=1e-2 if cuda else 1e-4,
                      greedy={sid: GreedyResult(**greedy[sid]) for sid in ids if sid in greedy})
    return {"tag": tag, "shard": shard, "hist": {k: s.histogram() for k, s in report.categories.items()},
            "prompts": len(report.prompts), "per_category": dict(Counter(r.category for r in report.prompts)),
            "skipped": report.skipped, "ties": report.ties, "spec_s": round(report.spec_s, 2), "new_tokens": report.new_tokens,
            "timing": {"fixed_s": round(t1 - t0, 2), "s_per_prompt": (time.perf_counter() - t1) / max(1, len(ids))}}


def merge_measure(parts: dict[str, dict[str, Any]], weights: dict[str, float]) -> dict[str, Any]:
    """A draft's measured figures from its shards' histograms (summed per category)."""
    from training.eval.simulate import AcceptanceStats, traffic_weighted

    sums: dict[str, list[int]] = {}
    for part in parts.values():
        for cat, hist in part["hist"].items():
            acc = sums.setdefault(cat, [0] * len(hist))
            for k, n in enumerate(hist):
                acc[k] += n
    cats = {cat: AcceptanceStats.from_histogram(h) for cat, h in sums.items()}
    overall = AcceptanceStats.from_histogram([sum(col) for col in zip(*sums.values(), strict=True)]) if sums else None
    per_cat: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for part in parts.values():
        per_cat.update(part["per_category"])
        skipped.update(part["skipped"])
    return {"measured": {k: round(s.acceptance_length, 4) for k, s in cats.items() if s.forwards},
            "measured_weighted": _r(traffic_weighted(cats, weights)["acceptance_length"]) if cats else None,
            "measured_overall": _r(overall.acceptance_length) if overall else None,
            "measured_histograms": sums, "eval_prompts": sum(p["prompts"] for p in parts.values()),
            "eval_prompts_per_category": dict(per_cat), "eval_skipped": dict(skipped),
            "greedy_ties": sum(p["ties"] for p in parts.values()),
            "spec_s": round(sum(p["spec_s"] for p in parts.values()), 2),
            "new_tokens": sum(p["new_tokens"] for p in parts.values())}


def draft_plan(args: argparse.Namespace, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every draft, most important first: seed 0 at 2K of every arm, the forecast's subsets, 8K, the
    seeds 1 and 2 at 2K, then 8K's, then the largest size (what a call that fits only part ends with
    first: every arm's 2K draft measured). --calibrate: one draft per arm on whatever is answered."""
    from curator import forecast as fc

    sizes = sorted(int(n) for n in plan["sizes"])
    small, mid, large = sizes[0], sizes[1], sizes[-1]
    if args.calibrate:
        answered = done_ids(args.work / "gen-pool")
        return [{"tag": f"calib-{arm}", "arm": arm, "size": small, "seed": 0, "calibration": True,
                 "ids": [i for i in plan["arms"][arm][str(small)] if i in answered][: args.calib_samples]} for arm in ARMS]
    out: list[dict[str, Any]] = []

    def cell(n: int, seed: int) -> None:
        for arm in ARMS:
            out.append({"tag": f"{arm}-{n}-s{seed}", "arm": arm, "size": n, "seed": seed, "ids": plan["arms"][arm][str(n)]})

    cell(small, 0)
    by_cat: dict[str, list[str]] = {}
    for sid in plan["arms"]["matched"][str(small)]:
        by_cat.setdefault(plan["category_of"][sid], []).append(sid)
    for frac, ids in fc.nested_subsets(by_cat, list(FRACTIONS), seed=0).items():
        out.append({"tag": f"matched-{small}-x{frac:g}-s0", "arm": "matched", "size": small, "seed": 0, "ids": ids,
                    "fraction": frac})
    cell(mid, 0)
    for seed in args.seeds[1:]:
        cell(small, seed)
    for seed in args.seeds[1:]:
        cell(mid, seed)
    if large > mid:
        cell(large, 0)
    return out


def eval_shards(held: list[str], n: int) -> list[list[str]]:
    """The held-out prompts in `n` shards of near-equal size, categories interleaved (held is
    category-blocked), so every shard costs about the same."""
    return [held[k::n] for k in range(n) if held[k::n]]


class Timings:
    """Per kind of job, the worst fixed cost and per-unit cost seen so far (seeded from --timings, a
    calibration call's worst cases on the same card, else from the defaults below, which are guesses
    on the long side): a job starts only if fixed + per-unit x units ends before the deadline."""

    DEFAULTS = {"train": {"fixed_s": 120.0, "s_per_sample_epoch": 0.03},
                "measure": {"fixed_s": 60.0, "s_per_prompt": 2.0},
                "greedy": {"fixed_s": 60.0, "s_per_prompt": 1.0}}
    UNIT = {"train": "s_per_sample_epoch", "measure": "s_per_prompt", "greedy": "s_per_prompt"}

    def __init__(self, seed: dict[str, dict[str, float]] | None) -> None:
        self.t = {k: dict(v) for k, v in self.DEFAULTS.items()}
        self.source = {k: "default guess" for k in self.t}
        for kind, vals in (seed or {}).items():
            if kind in self.t:
                self.t[kind].update({k: float(v) for k, v in vals.items() if k in self.t[kind]})
                self.source[kind] = "calibration"
        self.seen: set[str] = set()

    def estimate(self, kind: str, units: float) -> float:
        t = self.t[kind]
        return t["fixed_s"] + t[self.UNIT[kind]] * units

    def observe(self, kind: str, timing: dict[str, float]) -> None:
        t = self.t[kind]
        if kind not in self.seen:  # the first real figure replaces a guess or a calibration's worst case
            t.update({k: float(v) for k, v in timing.items() if k in t})
        else:
            t.update({k: max(t[k], float(v)) for k, v in timing.items() if k in t})
        self.seen.add(kind)
        self.source[kind] = "observed"

    def to_json(self) -> dict[str, Any]:
        return {k: {**{n: round(v, 4) for n, v in vals.items()}, "source": self.source[k]} for k, vals in self.t.items()}


def stage_cd(args: argparse.Namespace, res: Results, prompts: dict[str, dict[str, Any]], plan: dict[str, Any],
             deadline: float, stages: str) -> None:
    """Train (C) and measure (D) on --workers processes sharing the GPU, most important first. A
    draft's measurement runs as --measure-shards jobs on as many workers and goes before any new
    training; no job starts that the worst timing of its kind so far says would end past the deadline."""
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
        if d["tag"] in drafts and drafts[d["tag"]].get("export") and Path(drafts[d["tag"]]["export"]).exists():
            continue
        # a prompt longer than --max-prompt-tokens is left out of every arm alike (counted in stage_b)
        d["ids"] = [i for i in d["ids"] if i not in too_long]
        missing = [i for i in d["ids"] if i not in answered]
        # A few unanswered prompts (a generation cut by the deadline) cost a draft 1% of its samples at
        # most, counted in its row; more than that and the draft waits for the answers.
        if len(missing) > len(d["ids"]) // 100 and not d.get("calibration"):
            not_run[f"train:{d['tag']}"] = f"{len(missing)} of its {len(d['ids'])} prompts have no answer yet"
            continue
        not_run.pop(f"train:{d['tag']}", None)
        d["unanswered"] = len(missing)
        d["ids"] = [i for i in d["ids"] if i in answered]
        if d["ids"]:
            todo_train.append(d)
    timing_file = args.timings if args.timings is not None and args.timings.is_file() else None
    timings = Timings(json.loads(timing_file.read_text(encoding="utf-8")) if timing_file else None)
    res.data["timings_seeded_from"] = str(timing_file) if timing_file else "defaults"
    pool = ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=_init, initargs=(ctx,))
    running: dict[Future, tuple[str, dict[str, Any], float]] = {}
    greedy_path = w / "greedy.json"  # JSON, not a pickle: nothing here is loaded with torch.load
    greedy: dict[str, Any] = json.loads(greedy_path.read_text(encoding="utf-8")) if greedy_path.is_file() else {}
    greedy_pending = "D" in stages and any(sid not in greedy for sid in held)
    if greedy_pending:
        # the reference on the workers the first trainings leave free (the 2K drafts start at once)
        free = max(1, args.workers - min(len(todo_train), len(ARMS)))
        todo = [sid for sid in held if sid not in greedy]
        for part in eval_shards(todo, free):
            running[pool.submit(run_timed, "greedy", part)] = ("greedy", {"ids": part}, time.perf_counter())
    queued: set[str] = set()

    def measure_queue() -> list[tuple[str, int, list[str]]]:
        """(tag, shard, ids) of every measurement shard not yet done or queued, in training order."""
        out = []
        for t, r in drafts.items():
            if not r.get("export") or r.get("measured_weighted") is not None:
                continue
            n = r.setdefault("measure_shards", args.measure_shards)
            parts = r.setdefault("measure_parts", {})
            for k, ids in enumerate(eval_shards(held, n)):
                if str(k) not in parts and f"{t}#{k}" not in queued:
                    out.append((t, k, ids))
        return out

    try:
        while True:
            now = time.perf_counter()
            while len(running) < args.workers:
                started = False
                if "D" in stages and not greedy_pending:
                    for t, k, ids in measure_queue():
                        queued.add(f"{t}#{k}")
                        est = timings.estimate("measure", len(ids))
                        if now + est > deadline:
                            not_run[f"measure:{t}"] = f"shard {k} not started: {deadline - now:.0f} s left, it takes ~{est:.0f} s"
                            continue
                        not_run.pop(f"measure:{t}", None)
                        running[pool.submit(run_timed, "measure", t, drafts[t]["export"], {i: greedy[i] for i in ids if i in greedy}, ids, k)] = (
                            "measure", {"tag": t, "shard": k}, now)
                        started = True
                        break
                if not started and "C" in stages and todo_train:
                    d = todo_train.pop(0)
                    est = timings.estimate("train", len(d["ids"]) * args.epochs)
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
                timings.observe(kind, out.pop("timing"))
                if kind == "greedy":
                    greedy.update(out["greedy"])
                    if not any(k == "greedy" for k, _, _ in running.values()):
                        greedy_pending = False
                        write_text(greedy_path, json.dumps(greedy))
                        res.data["greedy_s"] = round(dt, 1)
                elif kind == "train":
                    cats = Counter(plan["category_of"][i] for i in d["ids"])
                    drafts[d["tag"]] = {"arm": d["arm"], "size": d["size"], "seed": d["seed"],
                                        "fraction": d.get("fraction", 1.0), "category_samples": dict(cats),
                                        "unanswered": d.get("unanswered", 0), "calibration": d.get("calibration", False),
                                        "epochs": args.epochs, "measured": {}, "measured_weighted": None,
                                        **out, "simulated_weighted": weighted(out["simulated"], weights)}
                else:
                    r = drafts[d["tag"]]
                    r["measure_parts"][str(d["shard"])] = out
                    if len(r["measure_parts"]) == len(eval_shards(held, r["measure_shards"])):
                        r.update(merge_measure(r["measure_parts"], weights))
                        r["measure_s"] = round(time.perf_counter() - r.setdefault("measure_started", t0), 1)
                        del r["measure_parts"]
                        print(f"[measured {d['tag']}] {r['measured_weighted']} (simulated {r.get('simulated_weighted')})", flush=True)
                    else:
                        r.setdefault("measure_started", t0)
                print(f"[{kind} {d.get('tag', '')}{'#' + str(d['shard']) if 'shard' in d else ''}] {dt:.1f} s", flush=True)
                res.data["findings"] = findings(drafts)
                res.data["timing_guesses"] = timings.to_json()
                res.save()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for d in todo_train:
        not_run.setdefault(f"train:{d['tag']}", "not started: no time left")
    res.data["findings"] = findings(drafts)
    res.data["timing_guesses"] = timings.to_json()
    if args.calibrate:  # the worst cases seen, for the real calls' first jobs (--timings)
        cal = {k: {n: v for n, v in vals.items()} for k, vals in timings.t.items() if k in timings.seen}
        write_text(w / "timings.json", json.dumps(cal, indent=1))
        write_text(args.out / "timings.json", json.dumps(cal, indent=1))
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
    ap.add_argument("--measure-shards", type=int, default=None, help="jobs per draft measurement (default: --workers)")
    ap.add_argument("--timings", type=Path, default=None, help="a calibration call's timings.json: the first jobs' estimates")
    ap.add_argument("--random-target", type=Path, default=None,
                    help="a folder with the target's config and tokenizer: stage A makes a random-weight target of that shape")
    ap.add_argument("--gen-limit", type=int, default=None, help="answer at most this many prompts in all")
    ap.add_argument("--calib-samples", type=int, default=256, help="--calibrate: samples per draft")
    ap.add_argument("--calibrate", action="store_true",
                    help="time every kind of job (one draft per arm on what is answered) and write timings.json")
    ap.add_argument("--tiny", action="store_true", help="CPU dry run: tiny answers, 1 step per draft, 2 seeds")
    args = ap.parse_args(argv)
    if args.tiny:
        args.gen_batch, args.gen_new_tokens, args.eval_per_category, args.eval_new_tokens = 16, 8, 2, 6
        args.max_steps, args.batch, args.vocab, args.workers, args.seeds = 1, 4, 512, 2, [0, 1]
        args.max_prompt_tokens, args.max_length = 384, 512
    if args.measure_shards is None:
        args.measure_shards = args.workers
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
