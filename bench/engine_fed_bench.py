"""Engine-fed training against a real vLLM (CPU build) running extract_hidden_states, beside training
from a full store of the same engine's states, in one run.

    export CURATOR_VLLM_PYTHON=$(bash .ci/vllm.sh)
    python -m bench.engine_fed_bench --work /tmp/efb --samples 96 --epochs 2 --budget-fraction 0.25

The server is started with the flags `curator hidden-states --print-server-command` prints, the
connector swapped for the CPU shim of tests/serving (vLLM's ExampleHiddenStatesConnector with its CUDA
copy done plainly: the one departure from vLLM's code). Measured:
- store: `curator hidden-states --backend vllm` into a store (its bytes, capture time), then training
  from it (wall time, tokens/s);
- engine-fed with a cache budget (a fraction of the store's bytes) and engine-fed capturing every
  epoch: training wall time and tokens/s, and the disk high-water mark of the engine's shared folder
  plus the local cache, sampled every 5 ms while training runs.
Writes bench/results/engine_fed_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "serving"))


def du(*paths: Path) -> int:
    total = 0
    for p in paths:
        if not p.exists():
            continue
        for dirpath, _, files in os.walk(p):
            for f in files:
                try:
                    total += os.lstat(os.path.join(dirpath, f)).st_size
                except FileNotFoundError:
                    pass
    return total


class HighWater:
    """Samples the bytes under some folders on a thread; keeps the largest total seen."""

    def __init__(self, *paths: Path, every_s: float = 0.005) -> None:
        self.paths, self.every_s, self.peak = paths, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, du(*self.paths))
            time.sleep(self.every_s)

    def __enter__(self) -> HighWater:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, du(*self.paths))


def capture_flags(command: str, shared: Path) -> list[str]:
    argv = shlex.split(command)
    flags: list[str] = []
    for name in ("--speculative-config", "--kv-transfer-config"):
        flags += [name, argv[argv.index(name) + 1]]
    kv = json.loads(flags[3])
    kv.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path="cpu_hidden_states_connector")
    flags[3] = json.dumps(kv)
    return [*flags, "--no-enable-chunked-prefill"]


def train_timed(cfg: Any, factory: Any = None) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    from training.train.trainer import train

    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    result = train(cfg, on_metrics=records.append, capture_factory=factory)
    wall = time.perf_counter() - t0
    return wall, result.train, [r for r in records if r["split"] == "train"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--budget-fraction", type=float, default=0.25)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "engine_fed_cpu.json")
    args = ap.parse_args()

    import torch

    from curator.cli import main as curator
    from curator.hidden.engine_feed import capture_factory
    from curator.engines.vllm_capture import server_command
    from tests.conftest import toy_corpus
    from tests.training.capture.test_hidden_states import conversation, write_gen
    from training.storage.reader import HiddenStateStore
    from training.target.toy import build_target
    from training.train.config import TrainConfig
    from vllm_process import VllmServer

    torch.set_num_threads(1)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    target = work / "target"
    if not (target / "config.json").exists():
        # head_dim 32: vLLM's CPU attention has no kernel for the tests' head_dim 16
        build_target(toy_corpus(), target, vocab_size=512, seed=0, hidden_size=128, num_layers=4, num_heads=4,
                     num_kv_heads=2, max_position_embeddings=2048)
    gen = write_gen(work / "gen", [conversation(i) for i in range(args.samples)])
    shared = work / "shared"
    shared.mkdir(exist_ok=True)

    store = work / "store"
    cap = ["hidden-states", "--backend", "vllm", "--model", "target", "--target-dir", str(target), "--data",
           str(gen), "--out", str(store), "--shared-dir", str(shared), "--concurrency", "1", "--force"]
    # one request at a time: the store's index order is the generation order the engine feed reads,
    # so both runs train the same batches in the same order
    assert curator(["hidden-states", "--backend", "vllm", "--print-server-command", "--model", str(target),
                    "--shared-dir", str(shared)]) == 0
    from training.capture.prepare import store_meta
    from training.target.config import read_target_config
    from transformers import AutoTokenizer

    meta = store_meta(read_target_config(target), AutoTokenizer.from_pretrained(target), target="target",
                      layer_ids=None, dtype="bf16", has_final=True)
    printed = server_command("target", meta, str(shared))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "serving"), os.environ.get("PYTHONPATH", "")])}
    base = dict(target=str(target), draft_vocab_size=256, ttt_steps=3, lr=3e-3, global_batch_size=8,
                micro_batch_size=4, epochs=float(args.epochs), log_every=1, eval_fraction=0.05, eval_max_samples=4,
                seed=0, device="cpu")
    results: dict[str, Any] = {"samples": args.samples, "epochs": args.epochs, "machine": os.uname().nodename,
                               "cpus": os.cpu_count()}
    with VllmServer(target, work / "logs", capture_flags(printed, shared), max_num_seqs=4, env=env) as server:
        t0 = time.perf_counter()
        assert curator([*cap, "--endpoint", server.url]) == 0, server.log_tail()
        results["store_capture_s"] = time.perf_counter() - t0
        results["store_bytes"] = du(store)
        captured = HiddenStateStore.open(store)
        if len(captured) != args.samples:
            raise SystemExit(f"the engine captured {len(captured)} of {args.samples} samples:\n{server.log_tail()}")
        n_tokens = sum(captured.length(s) for s in captured.ids())
        results["tokens"] = n_tokens

        wall, last, recs = train_timed(TrainConfig.from_dict({**base, "data": str(store), "out": str(work / "r-store")}))
        store_losses = [r["loss"] for r in recs]
        results["store_train"] = {"wall_s": wall, "steps": last["step"], "loss": last["loss"],
                                  "mean_tokens_per_s": sum(r["tokens_per_s"] for r in recs) / len(recs)}
        engine = dict(engine=server.url, engine_model="target", engine_shared_dir=str(shared), engine_concurrency=2,
                      prefetch_samples=16, data=str(gen))
        budget = int(results["store_bytes"] * args.budget_fraction)
        for name, extra in (("engine_cache", {"cache_budget": budget}), ("engine_every_epoch", {"cache_budget": 0})):
            out = work / f"r-{name}"
            cfg = TrainConfig.from_dict({**base, **engine, **extra, "out": str(out)})
            with HighWater(shared, out / "engine-cache") as hw:
                wall, last, recs = train_timed(cfg, capture_factory(cfg))
            results[name] = {"wall_s": wall, "steps": last["step"], "loss": last["loss"],
                             "mean_tokens_per_s": sum(r["tokens_per_s"] for r in recs) / len(recs),
                             "disk_high_water_bytes": hw.peak, "feed": last.get("feed"),
                             "cache_budget_bytes": extra["cache_budget"],
                             "store_over_high_water": results["store_bytes"] / max(1, hw.peak),
                             "same_loss_curve_as_store": [r["loss"] for r in recs] == store_losses,
                             "max_loss_diff": max(abs(r["loss"] - x) for r, x in zip(recs, store_losses))}
        results["shared_left_after"] = sorted(p.name for p in shared.iterdir())
    s = results["store_train"]["mean_tokens_per_s"]
    for name in ("engine_cache", "engine_every_epoch"):
        results[name]["throughput_vs_store"] = results[name]["mean_tokens_per_s"] / s
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
