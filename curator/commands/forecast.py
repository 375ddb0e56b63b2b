"""`curator forecast`: the samples per category that reach a goal acceptance, with a band, and
what they cost (target tokens, GPU-hours, disk), from drafts trained on nested subsets of one pool."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import TextColumn

from curator.errors import ConfigError
from curator.ui import console, human_bytes, rows_table, stdout
from training.io.atomic import write_json


def _fractions(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--fractions takes comma-separated numbers like 0.125,0.25,0.5, not {text!r}") from None


def _n(value: float | None) -> str:
    """Return a sample count short enough for an 80-column table: 950, 12.3K, 1.19M."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "unbounded"
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if value >= div:
            return f"{value / div:.3g}{unit}"
    return f"{value:,.0f}"


def forecast_command(
    goal: Annotated[float, typer.Option("--goal", help="The acceptance length to reach, per category.")] = 3.0,
    runs: Annotated[Optional[list[Path]], typer.Option("--run", help="A finished `curator train` run directory (repeatable); its RUN/eval.json (a `curator eval --json` report) is used when present, else its simulated per-category acceptance.")] = None,
    store: Annotated[Optional[Path], typer.Option("--store", help="Hidden-state store to train nested subsets of (with --target, --fractions).")] = None,
    eval_store: Annotated[Optional[Path], typer.Option("--eval-store", help="Held-out store the subsets' drafts are judged on (default: a hashed 5% of --store set apart).")] = None,
    target: Annotated[Optional[Path], typer.Option("--target", help="The target's model directory: trains the drafts, and sets the bytes per token of the disk bill.")] = None,
    fractions: Annotated[str, typer.Option("--fractions", help="Nested subset sizes as fractions of --store.")] = "0.125,0.25,0.5",
    config: Annotated[Optional[Path], typer.Option("--config", help="Training config (JSON/YAML) every subset's draft is trained with: the one the full mix will train with (its epochs or max_steps are the budget the forecast speaks of).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a forecast that was stopped: finished subset runs are read back, the unfinished one resumes from its last checkpoint.")] = False,
    epochs: Annotated[Optional[float], typer.Option("--epochs", help="The budget the full mix will train with, in epochs (default: --config's; with --run: the runs' common max_steps, else the largest run's epochs).")] = None,
    max_steps: Annotated[Optional[int], typer.Option("--max-steps", min=1, help="The budget the full mix will train with, in steps of the runs' batch size (default: --config's).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Where the subsets' views and runs go.")] = Path("forecast-runs"),
    generation: Annotated[Optional[Path], typer.Option("--generation", help="A `curator generate --out` directory: tokens per sample by category and the measured output tokens/s.")] = None,
    tokens_per_s: Annotated[Optional[float], typer.Option("--tokens-per-s", help="Target output tokens/s (overrides generation.json's).")] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs behind that throughput.")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="Store dtype of the disk bill: bf16 or fp8.")] = "bf16",
    verify_cost: Annotated[Optional[float], typer.Option("--verify-cost", help="Cost of one speculative cycle (draft steps + verify) in plain decode steps: the break-even acceptance.")] = None,
    serve_report: Annotated[Optional[Path], typer.Option("--serve-report", help="A `curator bench-serve --json` report: break-even = acceptance / speedup per concurrency.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the nested subsets and of the band's draws.")] = 0,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the full forecast here.")] = None,
) -> int:
    """Forecast the samples per category that reach --goal acceptance, with a band and their cost."""
    from curator import forecast as fc

    if dtype not in ("bf16", "fp8"):
        raise ConfigError(f"--dtype is bf16 or fp8, not {dtype!r}")
    fc.check_goal(goal)
    if verify_cost is not None:
        fc.check_verify_cost(verify_cost)
    if tokens_per_s is not None and not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise ConfigError(f"--tokens-per-s is a positive number, not {tokens_per_s!r}")
    if epochs is not None and not (math.isfinite(epochs) and epochs > 0):
        raise ConfigError(f"--epochs is a positive number, not {epochs!r}")
    if epochs is not None and max_steps is not None:
        raise ConfigError("give the budget once: --epochs or --max-steps")
    for flag, path in (("--store", store), ("--eval-store", eval_store), ("--target", target), ("--config", config),
                       ("--generation", generation), ("--serve-report", serve_report)):
        if path is not None and not path.exists():  # named before anything is read or trained
            raise ConfigError(f"{flag} {path}: no such file or folder")
    if not runs and store is None:
        raise ConfigError("give --run RUN_DIR (three or more) or --store STORE --target TARGET to train nested subsets")
    # every input is read before any draft trains: a bad report must not wait behind an hour of training
    gen = fc.generation_cost(generation, gpus, tokens_per_s) if generation else None
    bpt = fc.store_bytes_per_token(target, dtype) if target else None
    if serve_report:  # its shape now; its acceptances against the runs' chain once that is known (below)
        fc.break_even_from_report(serve_report)
    pairs: list[tuple[dict[str, int], dict[str, float], float | None]] = []
    steps: set[int] = set()
    batches: set[int] = set()
    fixed: set[int | None] = set()
    bad: list[str] = []
    for run in runs or []:
        try:
            got = fc.run_point(run)
        except fc.BadPointError as exc:
            if len(runs or []) == 1:
                raise
            bad.append(str(exc))  # one bad run among several: counted and left out, the others still fit
            continue
        pairs.append(got.point_source())
        steps.add(got.steps)
        batches.add(got.batch_size)
        fixed.add(got.max_steps)
    if bad:
        console.print(f"[yellow]skipped {len(bad)} of {len(runs or [])} runs[/]: " + "; ".join(bad), highlight=False)
        if not pairs:
            raise ConfigError(f"none of the {len(bad)} runs can be read (first: {bad[0]})")
    budget = fc.Budget(epochs=epochs) if epochs is not None else None
    known = {f for f in fixed if f is not None}
    if budget is None and max_steps is None and len(fixed) == 1 and len(batches) == 1 and known:
        # every run trained one fixed step budget: the forecast speaks of that same one
        budget = fc.Budget(sequences=float(next(iter(known)) * next(iter(batches))))
    if store is not None:
        if target is None:
            raise ConfigError("--store needs --target (the drafts are trained against it)")
        from training.train.config import TrainConfig, load_run_config

        # train_nested sets each subset's data and out; these only satisfy the config's own check
        base = load_run_config(config, {"data": str(store), "target": str(target), "out": str(out)}).to_dict() if config else {}
        defaults = TrainConfig.from_dict({"data": str(store), "target": str(target), "out": str(out), **base})
        batches.add(defaults.global_batch_size)
        if budget is None and max_steps is None:
            # the subsets train as the full mix will: the forecast speaks of that same budget
            budget = (fc.Budget(sequences=float(defaults.max_steps * defaults.global_batch_size)) if defaults.max_steps
                      else fc.Budget(epochs=float(defaults.epochs)))
        from curator.train_progress import training_metrics
        from curator.ui import progress

        bar = progress(TextColumn("{task.fields[status]}"))  # one bar per subset's draft, as `curator train` draws
        with bar:
            nested = fc.train_nested(
                store, target, out, _fractions(fractions), base, eval_store=eval_store, seed=seed, resume=resume,
                on_metrics=lambda frac: training_metrics(bar, f"fraction {frac:g}"),
                on_run=lambda r: bar.console.print(
                    f"fraction {r.fraction:g}{' (finished before, read back)' if r.reused else ''}: "
                    f"{sum(r.counts.values()):,} samples, {r.train_steps:,} steps ({r.epochs:.3g} epochs), "
                    f"acceptance {json.dumps({c: round(v, 3) for c, v in r.acceptance.items()})}", highlight=False))
        for r in nested:
            pairs.append((r.counts, r.acceptance, r.epochs))
            steps.add(r.steps)
    if len(steps) > 1:
        raise ConfigError(f"the runs draft chains of different lengths {sorted(steps)}: their acceptances do not compare")
    if max_steps is not None:
        if len(batches) != 1:
            raise ConfigError(f"--max-steps needs one batch size, and the runs train with {sorted(batches)}: give --epochs")
        budget = fc.Budget(sequences=float(max_steps * batches.pop()))
    chain = steps.pop()
    # the report read again now that the runs' chain K is known: its acceptances lie in [1, K + 1]
    breaks = fc.break_even_from_report(serve_report, chain) if serve_report else []
    if verify_cost is not None:
        breaks.append(fc.BreakEven(verify_cost, "--verify-cost"))
    result = fc.make_forecast(fc.points_by_category(pairs), goal, chain, generation=gen, bytes_per_token=bpt,
                              break_even=breaks, seed=seed, budget=budget)
    result.left_out = fc.left_out_categories(pairs)
    render(result)
    if json_out is not None:
        write_json(json_out, result.to_json())
        console.print(f"forecast written to {json_out}")
    return 0


def render(result) -> None:
    """Print the per-category table (samples, band, cost) and the verdict lines."""
    rows, costs = [], []
    for c in result.categories:
        fit = c.fits.get(c.law) if c.law else None
        lo, hi = c.band or (None, None)
        sizes = [p.samples for p in c.points]
        rows.append([c.category, f"{len(sizes)}: {_n(min(sizes))}-{_n(max(sizes))}" if sizes else "-",
                     f"{fit.law} {fit.rmse:.3f}" if fit else "-", _n(c.needed) if c.verdict in ("forecast", "reached") else "-",
                     f"{_n(lo)}-{_n(hi)}" if c.band else "-"])
        if (cost := result.costs.get(c.category)) is not None:
            costs.append([c.category, _n(cost.samples), f"{cost.target_tokens / 1e6:,.1f}M",
                          f"{cost.gpu_hours:,.1f}" if cost.gpu_hours is not None else "-",
                          human_bytes(cost.disk_bytes) if cost.disk_bytes is not None else "-"])
    console.print(rows_table(["category", "runs: samples", "law, rmse", f"samples for {result.goal:g}", "band 10-90%"],
                             rows, title=f"forecast: acceptance {result.goal:g} with a chain of {result.steps}, at {result.budget.describe()}"))
    if costs:
        gen = result.generation
        tps = f"{gen.output_tokens_per_s:,.0f} output tokens/s x {gen.gpus} GPU(s)" if gen and gen.output_tokens_per_s else "no throughput"
        console.print(rows_table(["category", "samples", "target tokens", "GPU-hours", "disk"], costs,
                                 title=f"cost, at {tps}"))
    for c in result.categories:
        stdout.print(f"{c.category}: {c.verdict}" + (f": {c.reason}" if c.reason else ""), highlight=False, markup=False)
    for category, why in result.left_out.items():  # a category silently missing from the table reads as forgotten
        stdout.print(f"{category}: left out: {why}", highlight=False, markup=False)
    if result.generation is None:
        disk = "" if result.bytes_per_token is not None else " (and --target for the disk)"  # --target already given
        stdout.print(f"cost: give --generation GEN_DIR{disk} to price the samples", highlight=False, markup=False)
    for b in result.break_even:
        stdout.print(f"break-even acceptance {b.acceptance:.2f} ({b.source}): below it the draft makes serving slower",
                     highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add `forecast` to the CLI."""
    app.command("forecast")(forecast_command)
