"""torchrun on the GPUs of one host: sharded hidden-state capture and data-parallel draft training,
checked against one GPU and against a rank killed mid-run.

  1. a small reference target (bench/reference/target.py) and a pool of regenerated answers;
  2. capture: `torchrun --nproc-per-node N -m training.hidden_states` (every sample exactly once
     in the merged index, tokens/s, pinned host memory per process as torch's host allocator
     reports it), then a capture killed part-way and resumed with another world size;
  3. training: `torchrun --nproc-per-node N -m training.trainer --config ...` against
     `python -m training.trainer` on one GPU at the same global batch (loss curves, tokens/s per
     GPU, scaling efficiency), then a run whose rank 0 is SIGKILLed after a checkpoint and
     resumed with `--resume`: its final weights against the uninterrupted run's.

With one GPU (N = 1) the same code runs torchrun with world size 1, which exercises the launcher,
the process group, device placement and the kill/resume path but measures no scaling. NCCL's
NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the device notes require.

    python3 bench/distributed_gpu.py --workdir /tmp/dist --out dist.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENV = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def capture_rank(argv: list[str]) -> int:
    """One torchrun rank of the capture; prints its pinned host memory as torch reports it."""
    from training.capture import hidden_states

    code = hidden_states.main(argv)
    stats = torch.cuda.host_memory_stats() if torch.cuda.is_available() else {}
    print("HOSTMEM " + json.dumps({"rank": int(os.environ.get("RANK", "0")),
                                   "pinned_peak_bytes": int(stats.get("allocated_bytes.peak", stats.get("reserved_bytes.peak", 0))),
                                   "pinned_reserved_peak_bytes": int(stats.get("reserved_bytes.peak", 0))}), flush=True)
    return code


def run_capture(nproc: int, target: Path, gen: Path, out: Path, kill_at_first_shard: bool = False) -> dict[str, Any]:
    cmd = torchrun(nproc, str(Path(__file__)), "--capture-rank", "--model", str(target), "--data", str(gen),
                   "--out", str(out))
    t = time.perf_counter()
    # stdout to a file, not a pipe: a pipe nobody reads while we poll could fill and stall the ranks
    log = out.with_suffix(".log")
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, env=ENV, stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        if kill_at_first_shard:
            # Killed once the first shard is on disk: mid-capture whatever the model load took (a timed
            # kill landed after the capture had finished in two runs, so the resume saw a full store).
            while proc.poll() is None and not any((out / "shards").glob("*.safetensors")):
                time.sleep(0.02)
            finished = proc.poll() is not None
            if not finished:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"killed_after_s": round(time.perf_counter() - t, 1), "finished_before_kill": finished}
        proc.wait()
    out_text = log.read_text()
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"capture failed ({proc.returncode}):\n{out_text[-3000:]}")
    stats = [json.loads(line) for line in out_text.splitlines() if line.startswith("{") and "tokens_per_s" in line]
    mem = [json.loads(line[len("HOSTMEM "):]) for line in out_text.splitlines() if line.startswith("HOSTMEM ")]
    return {"nproc": nproc, "wall_s": round(wall, 1), "rank0": stats[-1] if stats else {}, "pinned_host": mem}


def check_index(store_dir: Path, gen_ids: set[str]) -> dict[str, Any]:
    from training.storage.index import read_index
    from training.storage.reader import HiddenStateStore

    entries, skipped = read_index(store_dir)
    stored = HiddenStateStore.open(store_dir)
    ids = stored.ids()
    return {"stored": len(ids), "unique": len(set(ids)), "skipped": len(skipped),
            "every_sample_once": len(ids) == len(set(ids)) and set(ids) | set(skipped) == gen_ids,
            "shards": len(list((store_dir / "shards").glob("*.safetensors")))}


def train_cmd(nproc: int | None, config: Path, out: Path, *extra: str) -> list[str]:
    args = ["--config", str(config), f"out={out}", *extra]
    if nproc is None:
        return [sys.executable, "-m", "training.train.trainer", *args]
    return torchrun(nproc, "-m", "training.train.trainer", *args)


def read_metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_run(cmd: list[str], run: Path) -> dict[str, Any]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"training failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    train = [r for r in read_metrics(run) if r["split"] == "train"]
    return {"wall_s": round(time.perf_counter() - t, 1), "loss": [round(r["loss"], 6) for r in train],
            "tokens_per_s": round(sum(r["tokens_per_s"] for r in train[1:]) / max(1, len(train) - 1))}


def kill_rank0_after_checkpoint(cmd: list[str], run: Path, step: int) -> dict[str, Any]:
    """Start a run, SIGKILL its rank-0 worker once checkpoint `step` exists; return what happened."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    ckpt = run / "checkpoints" / f"step-{step:07d}"
    while not ckpt.exists():
        if proc.poll() is not None:
            raise SystemExit(f"run ended before checkpoint {step}: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        time.sleep(0.2)
    victim = proc.pid
    for pid in os.listdir("/proc"):  # the worker whose RANK is 0 (torchrun's child), else the launcher
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().split()[3])
        except OSError:
            continue
        if ppid == proc.pid and b"RANK=0" in env:
            victim = int(pid)
    os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=120)
    os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    done = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    return {"killed_pid_was_worker": victim != proc.pid, "launcher_exit": proc.returncode, "checkpoints_left": done}


def main() -> int:
    if "--capture-rank" in sys.argv:
        argv = [a for a in sys.argv[1:] if a != "--capture-rank"]
        return capture_rank(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="/tmp/curator-dist")
    p.add_argument("--out", default=None)
    p.add_argument("--nproc", type=int, default=max(1, torch.cuda.device_count()))
    p.add_argument("--target-seconds", type=float, default=30.0)
    p.add_argument("--source-bytes", type=int, default=40_000_000)
    p.add_argument("--pool", type=int, default=3000)
    p.add_argument("--train-steps", type=int, default=120)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    from bench.reference.run import write_mix
    from bench.reference.target import build_reference_target, code_windows, python_sources, split_sources
    from curator.generate import GenerateConfig, generate

    w = Path(args.workdir)
    w.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"nproc": args.nproc, "gpus": torch.cuda.device_count(),
                               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                               "torch": torch.__version__}

    def save() -> None:
        print(json.dumps(results), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))

    results["target"] = build_reference_target(w / "target", seconds=args.target_seconds, source_bytes=args.source_bytes,
                                                batch_size=128, device="cuda")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(w / "target")
    split = split_sources(python_sources(args.source_bytes))
    pool = [p for p, _ in code_windows(tok, split.pool, 128, 0, args.pool, seed=1)]
    write_mix(w / "mix", "pool", pool)
    stats = generate(GenerateConfig(mix=w / "mix", out=w / "gen", model=str(w / "target"), backend="transformers",
                                    temperature=0.0, max_tokens=128, batch_size=512, device="cuda"))
    gen_ids = {f"pool-{i:06d}" for i in range(len(pool))}
    results["generate"] = {"samples": stats.done_total}
    save()

    # -- capture: N ranks, 1 rank, and a killed N-rank run resumed with another world size
    results["capture"] = {"n": run_capture(args.nproc, w / "target", w / "gen", w / "states")}
    results["capture"]["n"]["index"] = check_index(w / "states", gen_ids)
    if args.nproc > 1:
        results["capture"]["one"] = run_capture(1, w / "target", w / "gen", w / "states-1")
    other = 1 if args.nproc > 1 else 2
    # kill part-way through the capture itself, once its first shard is written
    results["capture"]["killed"] = run_capture(args.nproc, w / "target", w / "gen", w / "states-resume",
                                               kill_at_first_shard=True)
    results["capture"]["killed"]["stored_before_resume"] = check_index(w / "states-resume", gen_ids)["stored"] \
        if (w / "states-resume" / "meta.json").exists() else 0
    if other <= torch.cuda.device_count():
        resumed = run_capture(other, w / "target", w / "gen", w / "states-resume")
        resumed["index"] = check_index(w / "states-resume", gen_ids)
        results["capture"]["resumed_with_world_size"] = {"world_size": other, **resumed}
    else:  # one GPU: resume with the same world size (another one needs more GPUs)
        resumed = run_capture(args.nproc, w / "target", w / "gen", w / "states-resume")
        resumed["index"] = check_index(w / "states-resume", gen_ids)
        results["capture"]["resumed_with_world_size"] = {"world_size": args.nproc, **resumed}
    save()

    # -- training: N GPUs vs 1 GPU at the same global batch, then a rank killed and resumed
    config = w / "train.json"
    config.write_text(json.dumps({
        "data": str(w / "states"), "target": str(w / "target"), "draft_vocab_size": 8192, "ttt_steps": 4,
        "lr": 1e-3, "warmup_ratio": 0.03, "global_batch_size": args.batch, "micro_batch_size": args.batch // args.nproc,
        "max_steps": args.train_steps, "max_length": 288, "log_every": 10, "eval_fraction": 0.05, "seed": 0,
        "device": "cuda",
    }))
    runs: dict[str, Any] = {}
    runs["one_gpu"] = train_run(train_cmd(None, config, w / "run-1"), w / "run-1")
    runs["torchrun"] = train_run(train_cmd(args.nproc, config, w / "run-n"), w / "run-n")
    a, b = runs["one_gpu"]["loss"], runs["torchrun"]["loss"]
    runs["max_loss_diff"] = max(abs(x - y) for x, y in zip(a, b))
    runs["tokens_per_s_per_gpu"] = round(runs["torchrun"]["tokens_per_s"] / args.nproc)
    runs["scaling_efficiency"] = round(runs["torchrun"]["tokens_per_s"] / (args.nproc * runs["one_gpu"]["tokens_per_s"]), 3)
    kill_step = args.train_steps // 2
    cut = w / "run-cut"
    runs["killed"] = kill_rank0_after_checkpoint(train_cmd(args.nproc, config, cut, f"save_every={kill_step}"), cut, kill_step)
    runs["resumed"] = train_run(train_cmd(args.nproc, config, cut, f"save_every={kill_step}", "--resume"), cut)
    from safetensors.torch import load_file

    whole = load_file(str(w / "run-n" / "checkpoints" / f"step-{args.train_steps:07d}" / "draft.safetensors"))
    again = load_file(str(cut / "checkpoints" / f"step-{args.train_steps:07d}" / "draft.safetensors"))
    runs["resume_max_weight_diff"] = max(float((whole[k].float() - again[k].float()).abs().max()) for k in whole)
    runs["resume_loss_diff"] = max(abs(x - y) for x, y in zip(runs["torchrun"]["loss"], runs["resumed"]["loss"][-len(runs["torchrun"]["loss"]):]))
    results["train"] = runs
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
