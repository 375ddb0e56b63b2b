"""`curator generate`: regenerate every answer of a mix through the target model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape
from pydantic import ValidationError
from rich.progress import TextColumn

from curator.errors import ConfigError, EndpointError
from curator.http import DEFAULT_MAX_ANSWER_BYTES
from curator.ui import console, progress, summary_table

if TYPE_CHECKING:  # the generate stage imports torch (token-exact rendering): only a run pays for it
    from curator.generate import GenerationStats


def _parse_extra_body(text: Optional[str]) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--extra-body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError('--extra-body must be a JSON object, e.g. \'{"chat_template_kwargs": {"enable_thinking": true}}\'')
    return value


def summary_rows(stats: GenerationStats) -> list[tuple[str, object]]:
    """Return the (what, value) rows of the end-of-run summary."""
    from curator.generate.progress import short_endpoint  # the generate package loads torch: only a run pays

    rows: list[tuple[str, object]] = [
        ("run", stats.run_id),
        ("model", stats.model),
        ("mix rows", stats.mix_rows),
        ("already done before this run", stats.already_done),
        ("generated now", stats.generated),
        ("kept (keep_responses)", stats.kept),
        ("errors now", stats.errors),
        ("  of which malformed rows", stats.malformed),
        ("earlier errors skipped (see --retry-errors)", stats.skipped_errors),
        ("answers cut at --max-tokens", stats.finish_length),
        ("rows whose tools the template drops", stats.tools_dropped),
        ("requests / retries", f"{stats.requests:,} / {stats.retries:,}"),
        ("output tokens", stats.completion_tokens),
        ("wall time (s)", round(stats.wall_s, 1)),
        ("requests/s", round(stats.requests_per_s, 2)),
        ("output tokens/s", round(stats.output_tokens_per_s, 1)),
    ]
    for name, n in stats.requests_by_endpoint.items():
        rows.append((f"requests on {short_endpoint(name)}", f"{n:,} ({stats.errors_by_endpoint.get(name, 0):,} failed)"))
    rows += [
        ("done in output", f"{stats.done_total:,} / {stats.mix_rows:,}"),
        ("failed in errors.jsonl", stats.errors_total),
        ("still missing", stats.missing),
    ]
    return rows


def generate_command(
    mix: Path = typer.Option(..., "--mix", help="Mix folder from `curator build-mix` (*.parquet)."),
    out: Path = typer.Option(..., "--out", help="Output folder: shard-*.jsonl, errors.jsonl, generation.json."),
    model: str = typer.Option(..., "--model", help="Served model name (openai) or model folder (transformers)."),
    endpoint: list[str] = typer.Option([], "--endpoint", help="OpenAI-compatible server URL; repeat for several."),
    concurrency: int = typer.Option(64, "--concurrency", help="Requests in flight per endpoint."),
    temperature: float = typer.Option(0.7, "--temperature", help="Sampling temperature (0: greedy)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus sampling (server default when unset)."),
    max_tokens: int = typer.Option(4096, "--max-tokens", help="Most tokens per answer."),
    extra_body: Optional[str] = typer.Option(
        None, "--extra-body", help="JSON object merged into each request body, e.g. the chat template's options (chat_template_kwargs)."
    ),
    retry_errors: bool = typer.Option(False, "--retry-errors", help="Try ids in errors.jsonl again."),
    request_timeout: float = typer.Option(
        1800.0, "--request-timeout", min=0.001,
        help="Seconds one whole request may take, from sending to the answer's last byte, before it counts "
             "as a transient failure (retried).",
    ),
    max_answer_bytes: int = typer.Option(
        DEFAULT_MAX_ANSWER_BYTES, "--max-answer-bytes", min=1024,
        help="Largest answer read from a server (default 16 MiB); a larger one is a failed row, never stored.",
    ),
    max_attempts: int = typer.Option(
        8, "--max-attempts", min=1,
        help="Tries per request, the first included, before a transient failure is recorded in errors.jsonl.",
    ),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N rows of the mix."),
    backend: str = typer.Option("openai", "--backend", help="openai (servers) or transformers (in-process)."),
    batch_size: int = typer.Option(16, "--batch-size", help="transformers backend: conversations per batch."),
    device: Optional[str] = typer.Option(None, "--device", help="transformers backend: cuda, mps or cpu (default: best present)."),
    seed: int = typer.Option(0, "--seed", help="transformers backend: sampling seed."),
    engine: str = typer.Option("chat", "--engine", help="token-exact generation: sglang (/generate with input_ids) "
                               "or vllm (completions with token ids); chat: chat completions, text only."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="token-exact: the target's tokenizer (default: --model)."),
    refuse_dropped_tools: bool = typer.Option(
        False, "--refuse-dropped-tools",
        help="A row offering tools the target's chat template does not render is a row error (default: generated "
             "and marked tools_dropped).",
    ),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Catalog file to record the run in (default: $CURATOR_CATALOG, else ./catalog.duckdb where one exists: none is created unasked)."),
) -> None:
    """Regenerate every answer of a mix through the target model; resumes by sample id."""
    try:
        from curator.generate import GenerateConfig

        config = GenerateConfig(
            mix=mix, out=out, model=model, endpoints=endpoint, backend=backend, concurrency=concurrency,
            temperature=temperature, top_p=top_p, max_tokens=max_tokens, extra_body=_parse_extra_body(extra_body),
            retry_errors=retry_errors, limit=limit, batch_size=batch_size, device=device, seed=seed,
            request_timeout_s=request_timeout, max_answer_bytes=max_answer_bytes, max_attempts=max_attempts,
            engine=engine, tokenizer=tokenizer, refuse_dropped_tools=refuse_dropped_tools,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"--{'-'.join(str(p) for p in first['loc']).replace('_', '-')}: {first['msg']}") from exc
    from curator.generate.progress import LiveProgress
    from curator.stages import generate_and_record

    bar = progress(TextColumn("{task.fields[info]}"))
    with bar:
        recorded = generate_and_record(config, catalog, on_progress=LiveProgress(bar))
    stats = recorded.result
    console.print(summary_table("generation", summary_rows(stats)))
    if stats.tools_dropped:  # loud: a user after tool data gets prompts without a tool definition
        what = "refused (row errors)" if config.refuse_dropped_tools else "generated without them, marked tools_dropped"
        console.print(f"[yellow]warning:[/] {stats.tools_dropped:,} rows offer tools that the target's chat template "
                      f"does not render: {what}; the target never saw a tool definition for them")
    if recorded.warning:  # the run is complete on disk whatever the catalog says: a warning, not an error
        console.print(f"[yellow]warning:[/] {escape(recorded.warning)}")
    if stats.status == "failed":  # nothing to train on: a script must not carry on as if it worked
        raise EndpointError(f"every row failed ({stats.errors_total}); the reasons are in {out / 'errors.jsonl'}")


def register(app: typer.Typer) -> None:
    """Add `generate` to the CLI."""
    app.command("generate")(generate_command)
