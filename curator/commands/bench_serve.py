"""`curator bench-serve`: output tokens/s, time per output token and the engine's own acceptance
length of a running server with the draft, beside a baseline server without it, per category."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from curator.errors import ConfigError
from curator.ui import console, progress, rows_table, stdout
from training.io.atomic import write_json


def _concurrencies(values: list[str]) -> list[int]:
    try:
        out = [int(v) for item in values for v in item.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--concurrency {values}: give whole numbers, e.g. 1,8,32") from None
    if not out or any(c < 1 for c in out):
        raise ConfigError(f"--concurrency {values}: every value must be at least 1")
    return sorted(set(out))


def bench_serve_command(
    endpoint: Annotated[str, typer.Option("--endpoint", help="Base URL of the server running the draft.")],
    prompts: Annotated[Path, typer.Option("--prompts", help="Mix directory (its held-out rows with --draft) or a JSONL/text prompt file.")],
    baseline: Annotated[str | None, typer.Option("--baseline", help="Base URL of the same target served without speculative decoding.")] = None,
    engine: Annotated[str, typer.Option("--engine", help="sglang (native /generate) or vllm (chat completions + /metrics).")] = "sglang",
    baseline_engine: Annotated[str | None, typer.Option("--baseline-engine", help="Engine of --baseline (default: --engine).")] = None,
    served_model: Annotated[str | None, typer.Option("--served-model", help="vLLM served model name (default: the first of /v1/models).")] = None,
    draft: Annotated[Path | None, typer.Option("--draft", help="The exported draft: its checkpoint's split picks the mix's held-out rows.")] = None,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help="The target's local model directory: renders prompts to ids for SGLang.")] = None,
    concurrency: Annotated[list[str] | None, typer.Option("--concurrency", help="Requests in flight; repeat or comma-separate (1,8,32). Default 1.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Output tokens per request.")] = 256,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="Sampling temperature of every request: 0 is greedy; serve-time temperatures lower acceptance.")] = 0.0,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most this many prompts, spread over categories.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds one whole request may take, from sending to the last byte of the answer.")] = 600.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
) -> int:
    """Measure the draft inside the serving engine: tokens/s, time per output token, acceptance, speedup."""
    from curator.engines import ENGINES
    from curator.serve_bench.client import Endpoint
    from curator.serve_bench.prompts import load_bench_prompts
    from curator.serve_bench.run import bench_serve

    levels = _concurrencies(concurrency or ["1"])
    draft_ep = Endpoint(engine, endpoint, served_model or "")
    base_ep = Endpoint(baseline_engine or engine, baseline, served_model or "") if baseline else None
    needs_ids = any(ENGINES[ep.engine].BENCH_TAKES_TOKEN_IDS for ep in (draft_ep, base_ep) if ep is not None)
    if needs_ids and tokenizer is None:
        raise ConfigError("SGLang's /generate takes token ids: pass --tokenizer (the target's local model directory)")
    chosen, source = load_bench_prompts(prompts, draft_dir=draft, tokenizer_dir=tokenizer if needs_ids else None,
                                        limit=limit)
    console.print(f"prompts: {len(chosen)} from {source}")
    total = len(chosen) * len(levels) * (2 if base_ep else 1)
    with progress() as bar:
        task = bar.add_task("requests", total=total)
        report = bench_serve(draft_ep, base_ep, chosen, concurrencies=levels, max_tokens=max_tokens, source=source,
                             timeout_s=timeout, on_request=lambda _: bar.advance(task), temperature=temperature)
    render_bench(report)
    if json_out is not None:
        write_json(json_out, {"endpoint": draft_ep.url, "baseline": base_ep.url if base_ep else None, "engine": engine,
                              **report.to_json()})
        console.print(f"report written to {json_out}")
    return 0


def render_bench(report) -> None:
    """Print a table per concurrency (endpoint x category) and the verdict lines (stdout)."""
    for c in report.concurrencies():
        rows = []
        for g in (g for g in report.groups if g.concurrency == c):
            j = g.to_json()
            rows.append([g.endpoint, g.category, j["requests"], j["tokens_per_s"], j["request_tokens_per_s"],
                         j["time_per_output_token_ms"], j["acceptance_length"]])
        for label in ("draft", "baseline"):
            tps = report.tokens_per_s(label, c)
            if tps is not None:
                rows.append([label, "all", "", tps, "", "", report.acceptance_length(c) if label == "draft" else None])
        console.print(rows_table(["endpoint", "category", "requests", "output tok/s", "tok/s per request",
                                  "ms per output token", "acceptance length"], rows, title=f"concurrency {c}"))
    for c, line in report.verdicts().items():
        stdout.print(f"concurrency {c}: {line}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add `bench-serve` to the CLI."""
    app.command("bench-serve")(bench_serve_command)
