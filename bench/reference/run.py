"""The reference benchmark: the data-scaling curve of EAGLE-3 drafts, made end to end with the
toolkit's own pipeline on a target trained on the spot.

  1. target: a ~34M-parameter code-chat Llama trained for a few minutes (bench/reference/target.py)
  2. prompts: code prefixes from files disjoint from the target's training text, in a pool and a
     held-out set that share no file
  3. regeneration of every answer through `curator generate`'s in-process backend (greedy, or
     sampled at `--temperature`, which the measurement then verifies at too)
  4. hidden states of pool and held-out answers (`training.capture.hidden_states`, bf16; fp8 optionally)
  5. one draft per pool size, all with the same step budget (`training.train.trainer`)
  6. per draft: the offline estimates on the held-out states (simulated decoding, training.eval.simulate,
     and the teacher-forced one), then `curator eval`'s speculative decoding on held-out prompts
     (measured acceptance length, output checked against greedy); the simulation is also run on
     exactly the measured prompts' stored continuations, and its error against the measured figure
     and its cost (seconds per 1,000 held-out tokens) recorded

Prints a table and one JSON line; `--out FILE` also writes the JSON, after every stage and
draft (marked "partial" until the end), so a run cut off by a time limit keeps what it finished.
The whole run (three pools and the fp8 row) takes about 8 minutes on one H200. A run split
into two calls can rebuild its target in the second with `--target-steps` (the first's step
count) and the same seed; compare `weights_sha256` to see whether the GPU made it bit for bit.
Runs on one GPU with torch, transformers, tokenizers, safetensors, numpy, pyarrow and pydantic (carry pydantic's
wheels to the GPU machine; see bench/RESULTS.md). `--tiny` runs the same code at toy sizes
on a CPU (the tests do).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.reference.modes import mismatch_share, text_copy  # noqa: E402
from bench.reference.target import build_reference_target, code_windows, python_sources, split_sources  # noqa: E402
from curator.generate import GenerateConfig, generate  # noqa: E402
from curator.mix.publish import write_tables  # noqa: E402
from training.capture import hidden_states  # noqa: E402
from training.io.atomic import write_text  # noqa: E402
from training.eval.evaluate import evaluate, load_target  # noqa: E402
from training.eval.prompts import EvalPrompt  # noqa: E402
from training.eagle3.proposer import DraftProposer  # noqa: E402
from training.eval.sampling import Sampling  # noqa: E402
from training.export.export import export_checkpoint  # noqa: E402
from training.eagle3.load import load_draft  # noqa: E402
from training.storage.reader import HiddenStateStore  # noqa: E402
from training.target.head import TargetHead  # noqa: E402
from training.train.config import TrainConfig  # noqa: E402
from training.eagle3.objective import offline_metrics  # noqa: E402
from training.eagle3.simulate import simulate_acceptance  # noqa: E402
from training.train.trainer import train  # noqa: E402


def write_mix(path: Path, prefix: str, prompts: list[str], categories: list[str] | None = None) -> Path:
    """Write prompts as a one-part mix (the build-mix schema), all "code" unless `categories` says
    each one's; return the folder."""
    path.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "id": [f"{prefix}-{i:06d}" for i in range(len(prompts))],
        "source": [f"reference-{prefix}"] * len(prompts),
        "category": categories or ["code"] * len(prompts),
        "messages": [[{"role": "user", "content": p}] for p in prompts],
        "turns": ["all"] * len(prompts),
        "keep_responses": [False] * len(prompts),
    })
    write_tables(path, [table], f"reference-{prefix}")
    return path


class Timer:
    """Wall time per stage, in order."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}

    def __call__(self, name: str):
        timer = self

        class _Stage:
            def __enter__(self) -> None:
                self.t = time.perf_counter()

            def __exit__(self, *exc: object) -> None:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                timer.stages[name] = round(time.perf_counter() - self.t, 1)
                print(f"[{name}] {timer.stages[name]} s", flush=True)

        return _Stage()


def run(args: argparse.Namespace, save: Any = None) -> dict[str, Any]:
    """Run every stage; return the results (figures, per-pool curve, stage timings).

    `save(results)` is called after each stage and each draft, so that a run cut off by a time
    limit still leaves every figure it finished.
    """
    save = save or (lambda _results: None)
    w = Path(args.workdir)
    w.mkdir(parents=True, exist_ok=True)
    device = args.device
    timer = Timer()
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k not in {"out"}}}

    with timer("target"):
        results["target"] = build_reference_target(
            w / "target", seconds=args.target_seconds, steps=args.target_steps, source_bytes=args.source_bytes, vocab_size=args.vocab,
            hidden_size=args.hidden, num_layers=args.layers, prefix_tokens=args.prefix_tokens,
            cont_tokens=args.cont_tokens, batch_size=args.target_batch, device=device,
        )
    print(json.dumps(results["target"]), flush=True)
    save(results)

    with timer("prompts"):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(w / "target")
        split = split_sources(python_sources(args.source_bytes))
        pools = sorted(int(p) for p in args.pools.split(","))
        pool = [p for p, _ in code_windows(tok, split.pool, args.prefix_tokens, 0, pools[-1], seed=1)]
        held = [p for p, _ in code_windows(tok, split.heldout, args.prefix_tokens, 0, args.heldout, seed=2)]
        if len(pool) < pools[-1] or len(held) < args.heldout:
            raise SystemExit(f"only {len(pool)} pool / {len(held)} held-out prompts; raise --source-bytes")
        write_mix(w / "mix-pool", "pool", pool)
        write_mix(w / "mix-heldout", "heldout", held)

    gen: dict[str, Any] = {}
    for name in ("pool", "heldout"):
        with timer(f"generate-{name}"):
            stats = generate(GenerateConfig(
                mix=w / f"mix-{name}", out=w / f"gen-{name}", model=str(w / "target"), backend="transformers",
                temperature=args.temperature, max_tokens=args.cont_tokens, batch_size=args.gen_batch, device=device,
            ))
        gen[name] = {"samples": stats.done_total, "output_tokens": stats.completion_tokens,
                     "output_tokens_per_s": round(stats.output_tokens_per_s)}
    results["generate"] = gen

    # Token mode trains on the target's own ids; text mode on the same answers re-tokenised
    # (`--modes text,token` compares them on the same prompts and steps).
    modes = [m for m in args.modes.split(",") if m]
    results["retokenisation"] = {name: mismatch_share(w / f"gen-{name}", tok) for name in ("pool", "heldout")}
    print(json.dumps({"retokenisation": results["retokenisation"]}), flush=True)
    dtypes = ["bf16", "fp8"] if args.fp8 else ["bf16"]
    capture: dict[str, Any] = {}
    for mode in modes:
        for dtype in dtypes:
            for name in ("pool", "heldout"):
                gen_dir = w / f"gen-{name}" if mode == "token" else text_copy(w / f"gen-{name}", w / f"gen-{name}-text")
                states = w / f"states-{name}-{dtype}{'' if mode == 'token' else '-text'}"
                with timer(f"hidden-states-{name}-{dtype}-{mode}"):
                    stats = hidden_states.run(w / "target", gen_dir, states, dtype=dtype)
                capture[f"{name}-{dtype}{'' if mode == 'token' else '-text'}"] = {
                    "tokens": stats.tokens, "tokens_per_s": round(stats.tokens_per_s),
                    "bytes": HiddenStateStore.open(states).disk_bytes()}
    results["hidden_states"] = capture
    results["stages_s"] = timer.stages
    save(results)

    # The target verifies in float32: in bf16, batched verification and one-token greedy decoding
    # of a sharp target differ by more than a tenth of a logit, and the greedy check then fails.
    target, tokenizer = load_target(w / "target", device=device, dtype=torch.float32)
    eval_prompts = [EvalPrompt(id=f"heldout-{i}", messages=[{"role": "user", "content": p}], category="code")
                    for i, p in enumerate(held[: args.eval_prompts])]
    runs = [(n, "bf16", mode) for mode in modes for n in pools] + ([(pools[-1], "fp8", modes[-1])] if args.fp8 else [])
    curve: list[dict[str, Any]] = []
    results["curve"] = curve
    for n, dtype, mode in runs:
        sfx = "" if mode == "token" else "-text"
        tag = f"{n}-{dtype}{sfx}"
        cfg = TrainConfig(
            data=str(w / f"states-pool-{dtype}{sfx}"), eval_data=str(w / f"states-heldout-{dtype}{sfx}"),
            target=str(w / "target"), out=str(w / f"run-{tag}"), max_train_samples=n,
            draft_vocab_size=args.vocab, ttt_steps=args.ttt_steps, lr=args.lr, warmup_ratio=0.03,
            global_batch_size=args.batch, micro_batch_size=args.batch, max_steps=args.train_steps,
            max_length=args.prefix_tokens + args.cont_tokens + 32, eval_max_samples=args.heldout,
            log_every=max(1, args.train_steps // 6), eval_every=0, save_every=0, device=device, seed=0,
        )
        with timer(f"train-{tag}"):
            result = train(cfg)
        export_checkpoint(w / f"run-{tag}", w / f"export-{tag}", fmt="sglang")
        draft = load_draft(w / f"export-{tag}", w / "target").to(device)
        with timer(f"offline-{tag}"):
            head = TargetHead.from_pretrained(w / "target", dtype=torch.float32, device=device)
            held_store = HiddenStateStore.open(w / f"states-heldout-{dtype}{sfx}")
            offline = offline_metrics(draft.float(), held_store, held_store.ids(), args.eval_steps, head,
                                      max_length=cfg.max_length)
        with timer(f"simulate-{tag}"):
            # decoding replayed on the stored greedy continuations, with the measurement's token budget
            sim_kw = dict(steps=args.eval_steps, max_length=cfg.max_length, max_new_tokens=args.eval_new_tokens)
            sim = simulate_acceptance(draft.float(), held_store, sorted(held_store.ids()), target_head=head, **sim_kw)
            same_ids = [f"heldout-{i:06d}" for i in range(len(eval_prompts)) if f"heldout-{i:06d}" in held_store]
            sim_same = simulate_acceptance(draft.float(), held_store, same_ids, **sim_kw)
        draft = draft.to(torch.bfloat16 if device == "cuda" else torch.float32)
        with timer(f"eval-{tag}"):
            # at a temperature: sampled verification, and every answer above was sampled at it too
            sampling = Sampling(args.temperature, seed=0) if args.temperature > 0 else None
            report = evaluate(target, tokenizer, DraftProposer(draft), eval_prompts, steps=args.eval_steps,
                              max_new_tokens=args.eval_new_tokens, tie_margin=1e-2 if device == "cuda" else 1e-4,
                              sampling=sampling)
        row = {
            "pool": n, "dtype": dtype, "mode": mode, "temperature": args.temperature, "train_steps": result.step,
            "train_tokens_per_s": result.train.get("tokens_per_s"),
            "offline_accept_length": round(offline["accept_length"], 3),
            "offline_acc": [round(a, 3) for a in offline["acc"]],
            "measured_accept_length": round(report.overall.acceptance_length, 3),
            "measured_per_position": [round(r["rate"], 3) for r in report.overall.position_rates()],
            "simulated_accept_length": round(sim.acceptance_length, 3),
            "simulated_per_position": [round(r["rate"], 3) for r in sim.overall.position_rates()],
            "simulated_same_prompts": round(sim_same.acceptance_length, 3),
            "simulated_error": round(sim_same.acceptance_length / report.overall.acceptance_length - 1, 4),
            "simulated_s_per_1k_tokens": round(sim.seconds_per_1k_tokens(), 4),
            "greedy_agreement": sim.greedy_agreement,
            "eval_prompts": len(report.prompts), "greedy_ties": report.ties,
        }
        curve.append(row)
        print(json.dumps(row), flush=True)
        save(results)
    results["stages_s"] = timer.stages
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="/tmp/curator-reference")
    p.add_argument("--out", default=None, help="also write the results JSON here")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="toy sizes for a CPU smoke run")
    p.add_argument("--target-seconds", type=float, default=100.0)
    p.add_argument("--target-steps", type=int, default=None,
                   help="train the target this many steps instead of for --target-seconds: a later run, split off "
                        "from a first one, rebuilds the same target (same seed, same steps)")
    p.add_argument("--source-bytes", type=int, default=120_000_000)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--target-batch", type=int, default=128)
    p.add_argument("--prefix-tokens", type=int, default=128)
    p.add_argument("--cont-tokens", type=int, default=128)
    p.add_argument("--pools", default="500,2000,8000")
    p.add_argument("--heldout", type=int, default=256)
    p.add_argument("--gen-batch", type=int, default=512)
    p.add_argument("--ttt-steps", type=int, default=4)
    p.add_argument("--train-steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-prompts", type=int, default=24)
    p.add_argument("--eval-new-tokens", type=int, default=64)
    p.add_argument("--eval-steps", type=int, default=4)
    p.add_argument("--modes", default="token", help="generation modes to train drafts on: token (the target's own "
                   "ids), text (the same answers re-tokenised), or text,token to compare them")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample every answer at this temperature and verify by sampling at it in the measurement "
                        "(0: greedy throughout)")
    p.add_argument("--fp8", action="store_true", help="also train and evaluate on fp8-stored states at the largest pool")
    args = p.parse_args(argv)
    if args.tiny:
        args.target_seconds, args.source_bytes, args.vocab, args.hidden, args.layers = 5.0, 6_000_000, 512, 64, 4
        args.target_batch, args.prefix_tokens, args.cont_tokens, args.pools, args.heldout = 8, 24, 16, "16,32", 8
        args.gen_batch, args.train_steps, args.batch, args.eval_prompts, args.eval_new_tokens = 16, 4, 8, 2, 8
    return args


def run_saving(args: argparse.Namespace, run_fn: Callable[[argparse.Namespace, Callable[[dict[str, Any]], None]], dict[str, Any]],
               default: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Return `run_fn(args, save)`'s results with the run's total_s, device and versions added;
    `save(partial)` keeps what is done so far in args.out (when given), written whole or not at all."""
    import transformers

    t0 = time.perf_counter()
    env = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
    }

    def save(partial: dict[str, Any]) -> None:
        if args.out:
            write_text(args.out, json.dumps({**partial, **env, "partial": True,
                                             "elapsed_s": round(time.perf_counter() - t0, 1)}, default=default) + "\n")

    results = run_fn(args, save)
    results["total_s"] = round(time.perf_counter() - t0, 1)
    results.update(env)
    return results


def write_results(args: argparse.Namespace, results: dict[str, Any], default: Callable[[Any], Any] | None = None) -> str:
    """Return the results as one JSON line, written to args.out (when given) in place of the partial ones."""
    line = json.dumps(results, default=default)
    if args.out:
        write_text(args.out, line + "\n")
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_saving(args, run)
    print(f"{'pool':>6} {'dtype':>5} {'mode':>5} {'teacher-forced':>14} {'simulated':>9} {'same prompts':>12} "
          f"{'measured AL':>11} {'sim error':>9} {'s/1k tok':>8}")
    for row in results["curve"]:
        print(f"{row['pool']:>6} {row['dtype']:>5} {row['mode']:>5} {row['offline_accept_length']:>14.3f} "
              f"{row['simulated_accept_length']:>9.3f} {row['simulated_same_prompts']:>12.3f} "
              f"{row['measured_accept_length']:>11.3f} {row['simulated_error']:>+9.1%} "
              f"{row['simulated_s_per_1k_tokens']:>8.3f}")
    print(write_results(args, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
