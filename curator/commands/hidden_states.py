"""`curator plan` (the disk bill) and `curator hidden-states` (capture into a shard store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.progress import TaskID

from curator.engines.vllm import CAPTURE_SHARED_DIR
from curator.errors import ConfigError
from curator.ui import console, human_bytes, progress, quiet_library_progress, rows_table, stdout, summary_table

if TYPE_CHECKING:  # the model side imports torch: only a command that runs pays for it
    from training.records.chat_tokens import GenerationReadStats
    from training.capture.stats import ExtractStats
    from training.capture.plan import DiskPlan


def parse_layers(text: Optional[str]) -> Optional[list[int]]:
    """Return the layer ids of "2,30,58" (None for the default)."""
    if not text:
        return None
    try:
        return [int(x) for x in text.replace(" ", ",").split(",") if x]
    except ValueError as exc:
        raise ConfigError(f"--layers takes comma-separated integers like 2,30,58, not {text!r}") from exc


def plan_rows(plan: DiskPlan) -> list[tuple[str, object]]:
    """Return the (what, value) rows that head a plan."""
    s = plan.shape
    final = "aux + final" if plan.has_final else "aux only"
    rows: list[tuple[str, object]] = [
        ("model", f"{s.name}: hidden {s.hidden_size}, {s.num_layers} layers"),
        ("samples", plan.samples),
        ("lengths from", plan.lengths_from),
        ("dtype", plan.dtype),
        (f"bytes/token, {plan.n_aux} aux layers only", plan.aux_bytes_per_token),
        (f"bytes/token, {plan.n_aux} aux + final (default store)", plan.store_bytes_per_token)
        if plan.has_final else ("bytes/token of this store", plan.store_bytes_per_token),
        (f"this store ({final}, max_len {plan.chosen.max_len or 'none'})", human_bytes(plan.chosen.store_bytes)),
    ]
    if plan.free_bytes is not None:
        rows += [(f"free at {plan.out_dir}", human_bytes(plan.free_bytes)), ("fits", "yes" if plan.fits else "NO")]
    return rows


def plan_json(plan: DiskPlan) -> dict[str, Any]:
    """Return the plan as a JSON-ready dict."""
    return {
        "model": plan.shape.__dict__,
        "samples": plan.samples,
        "lengths_from": plan.lengths_from,
        "dtype": plan.dtype,
        "aux_bytes_per_token": plan.aux_bytes_per_token,
        "store_bytes_per_token": plan.store_bytes_per_token,
        "has_final": plan.has_final,
        "rows": [r.__dict__ for r in plan.rows],
        "chosen_max_len": plan.chosen.max_len,
        "out_dir": plan.out_dir,
        "free_bytes": plan.free_bytes,
        "fits": plan.fits,
    }


def plan(
    model: str = typer.Option(..., "--model", help="Target: model directory, its config.json, or a config dict file (JSON)."),
    data: Optional[Path] = typer.Option(None, "--data", help="Generation output (shard-*.jsonl): real per-sample lengths."),
    samples: Optional[int] = typer.Option(None, "--samples", help="Sample count, without --data."),
    avg_tokens: Optional[float] = typer.Option(None, "--avg-tokens", help="Mean tokens per sample, without --data."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Clip each sample to this many tokens."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp8 (e4m3, one scale per token and layer)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where the store would go: shows its free disk."),
    aux_layers: int = typer.Option(3, "--aux-layers", help="How many aux layers are stored."),
    no_final: bool = typer.Option(False, "--no-final", help="Plan a store without the final hidden state."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout."),
    epochs: int = typer.Option(1, "--epochs", help="Training epochs: prices a full store against engine-fed training."),
    cache_budget: Optional[str] = typer.Option(None, "--cache-budget", help="Engine-fed with captured samples kept "
                                               "up to this much disk (e.g. 500GB), the rest captured again."),
    capture_rate: Optional[float] = typer.Option(None, "--capture-rate", help="Measured prefill tokens/s of one "
                                                 "capture server: gives each choice's capture time."),
    servers: int = typer.Option(1, "--servers", help="Capture servers working at once (with --capture-rate)."),
    prefetch_samples: int = typer.Option(64, "--prefetch-samples", help="Engine-fed window: samples held ahead."),
) -> None:
    """Show the disk a hidden-state capture takes: tokens, bytes/token, totals per max_len, free disk.

    With --epochs/--cache-budget/--capture-rate, also the price of a full store against engine-fed training."""
    from training.records.chat_tokens import GenerationReadStats, generation_files, iter_generation
    from training.capture.plan import data_lengths, load_shape, make_plan

    if dtype not in ("bf16", "fp8"):
        raise ConfigError(f"--dtype must be bf16 or fp8, not {dtype!r}")
    if data is not None and (samples or avg_tokens):
        raise ConfigError("give either --data or --samples/--avg-tokens, not both")
    shape = load_shape(model)
    lengths, how = None, ""
    if data is not None:
        generation_files(data)
        read = GenerationReadStats()
        from curator.hidden.capture import load_tokenizer

        tokenizer = load_tokenizer(Path(model))
        with console.status("measuring sample lengths"):
            lengths, how, bad = data_lengths(iter_generation(data, read), tokenizer, shape.vocab_size)
        how = f"{data} ({how}; {read.malformed + bad} malformed skipped)"
    result = make_plan(
        shape, lengths=lengths, samples=samples, avg_tokens=avg_tokens, max_len=max_len, dtype=dtype,
        n_aux=aux_layers, has_final=not no_final, out_dir=out, lengths_from=how,
    )
    feeds = None
    if epochs > 1 or cache_budget or capture_rate:
        from curator.hidden.feed_plan_view import feed_choices

        feeds = feed_choices(result, epochs=epochs, cache_budget=cache_budget, capture_rate=capture_rate,
                             servers=servers, prefetch_samples=prefetch_samples)
    if as_json:
        plan = plan_json(result)
        if feeds is not None:
            plan["feeds"] = [{**c.__dict__, "prefill_total": c.prefill_total} for c in feeds]
        stdout.print_json(json.dumps(plan))
        return
    stdout.print(summary_table("hidden-state disk plan", plan_rows(result)))
    stdout.print(
        rows_table(
            ["max_len", "tokens", f"{aux_layers} aux layers", "aux + final", "saves"],
            [
                (r.max_len or "none", r.tokens, human_bytes(r.aux_bytes), human_bytes(r.aux_final_bytes), f"{r.saving:.0%}")
                for r in result.rows
            ],
        )
    )
    if feeds is not None:
        from curator.hidden.feed_plan_view import feed_table

        stdout.print(feed_table(feeds, capture_rate, servers))


def summary_rows(stats: ExtractStats, out: Path, backend: str, read: GenerationReadStats) -> list[tuple[str, object]]:
    """Return the (what, value) rows of the end-of-run summary."""
    return [
        ("backend", backend),
        ("store", str(out)),
        ("records read", stats.records),
        ("already stored before", stats.already_done),
        ("stored now (samples)", stats.stored),
        ("tokens", stats.tokens),
        ("loss tokens", stats.loss_tokens),
        ("bytes written", human_bytes(stats.bytes_written)),
        ("tokens/s", round(stats.tokens_per_s, 1)),
        ("wall time (s)", round(stats.wall_s, 1)),
        ("skipped: malformed", stats.malformed + read.malformed),
        ("skipped: no answer left after --max-len", stats.no_loss_tokens),
        ("skipped: longer than the target's positions (--max-len clips)", stats.too_long),
        ("skipped: NaN/inf states", stats.nonfinite),
        ("skipped: engine failures", stats.failed),
        ("clipped at --max-len", stats.truncated),
    ]


def hidden_states(
    model: str = typer.Option(..., "--model", help="Target directory (transformers), or the served model name (vllm)."),
    data: Optional[Path] = typer.Option(None, "--data", help="Generation output directory (shard-*.jsonl)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Store directory; an existing one is resumed."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Aux layer ids as inputs of decoder layers, e.g. 2,30,58 (default [2, N//2, N-3])."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, or fp8 (e4m3 + a float32 scale per token and layer)."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Clip each sample to this many tokens."),
    batch_tokens: int = typer.Option(16384, "--batch-tokens", help="Padded tokens per forward batch (transformers)."),
    no_final: bool = typer.Option(False, "--no-final", help="Do not store the final normed hidden state."),
    final_prenorm: bool = typer.Option(False, "--final-prenorm", help="Also store the final state before the target's final "
                                       "norm (H x 2 bytes a token more): what speculators trains on (`curator export-data`)."),
    force: bool = typer.Option(False, "--force", help="Start even when the plan says the disk is too small."),
    backend: str = typer.Option("transformers", "--backend", help="transformers (load the target here) or vllm (drive vLLM servers)."),
    endpoint: Optional[list[str]] = typer.Option(None, "--endpoint", help="vLLM server URL (repeatable)."),
    concurrency: int = typer.Option(8, "--concurrency", help="Requests in flight per vLLM endpoint."),
    retries: int = typer.Option(4, "--retries", help="Retries of a failed vLLM request (exponential backoff)."),
    target_dir: Optional[Path] = typer.Option(None, "--target-dir", help="Local target directory (config, tokenizer, norm weights) for --backend vllm when --model is a served name."),
    shared_dir: str = typer.Option(CAPTURE_SHARED_DIR, "--shared-dir", help="The engine's shared_storage_path: put in the --print-server-command command, and the only folder whose files a capture reads and removes."),
    path_map: Optional[str] = typer.Option(None, "--path-map", help="ENGINE_DIR=LOCAL_DIR when the engine's shared dir is mounted elsewhere here."),
    tensor_parallel: Optional[int] = typer.Option(None, "--tensor-parallel", help="vLLM --tensor-parallel-size in the printed command."),
    port: int = typer.Option(8000, "--port", help="Port in the printed vLLM command."),
    print_server_command: bool = typer.Option(False, "--print-server-command", help="Print the `vllm serve` command for this target and exit."),
) -> None:
    """Capture the target's aux-layer (and final) hidden states of regenerated data into a shard store."""
    from curator.hidden.capture import CaptureSettings, capture_hidden_states
    from training.records.chat_tokens import GenerationReadStats

    layer_ids = parse_layers(layers)
    if print_server_command:
        local = target_dir or (Path(model) if Path(model).is_dir() else None)
        _print_server_command(model, local, layer_ids, not no_final, shared_dir, port, tensor_parallel)
        return
    if data is None or out is None:
        raise ConfigError("--data GEN_DIR and --out DIR are required (except with --print-server-command)")
    settings = CaptureSettings(
        model=model, data=data, out=out, target_dir=target_dir, layer_ids=layer_ids, dtype=dtype,
        has_final=not no_final, final_prenorm=final_prenorm, max_len=max_len, batch_tokens=batch_tokens, backend=backend,
        endpoints=endpoint or [], concurrency=concurrency, retries=retries, path_map=path_map, shared_dir=shared_dir,
        check_disk=not force,
    )
    read = GenerationReadStats()
    quiet_library_progress()
    if not force:
        console.print("[dim]planning the disk (measuring the samples left to capture)[/]")
    from curator.signals import sigterm_as_ctrl_c

    with sigterm_as_ctrl_c(), progress() as bar:  # SIGTERM keeps the buffered samples, as Ctrl-C does
        # the bar appears once the input is read and the disk planned: a bad input is refused before it
        tasks: list[TaskID] = []
        stats = capture_hidden_states(settings, read=read,
                                      on_total=lambda n: tasks.append(bar.add_task("hidden states", total=n)),
                                      on_samples=lambda n: bar.advance(tasks[0], n))
    console.print(summary_table("hidden states", summary_rows(stats, out, backend, read)))


def _print_server_command(
    model: str, local: Optional[Path], layer_ids: Optional[list[int]], has_final: bool, shared_dir: str,
    port: int, tensor_parallel: Optional[int],
) -> None:
    from curator.engines.vllm_capture import layer_explanation, server_command
    from training.target.layers import check_layer_ids, default_aux_layers
    from training.capture.plan import load_shape
    from training.storage.format import StoreMeta

    if local is None:
        raise ConfigError(f"{model} is not a local directory: pass --target-dir with the target's config.json")
    shape = load_shape(local)
    ids = check_layer_ids(layer_ids or default_aux_layers(shape.num_layers), shape.num_layers)
    meta = StoreMeta(target=model, hidden_size=shape.hidden_size, num_layers=shape.num_layers,
                     vocab_size=shape.vocab_size, aux_layer_ids=ids, has_final=has_final)
    stdout.print(server_command(model, meta, shared_dir, port=port, tensor_parallel=tensor_parallel), highlight=False)
    console.print(layer_explanation(meta), highlight=False)
    console.print(
        f"The engine writes one file per request into {shared_dir}; the capture (same --shared-dir) reads and "
        "deletes them there and nowhere else, so that directory must be visible here at the same path (or pass "
        "--path-map ENGINE_DIR=LOCAL_DIR).",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Add `plan` and `hidden-states` to the CLI."""
    app.command("plan")(plan)
    app.command("hidden-states")(hidden_states)
