"""`curator eval`: speculative decoding with the target and the draft, measured."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from curator.errors import ConfigError
from curator.evaluation.measure import measure
from curator.ui import console, quiet_library_progress, rows_table, summary_table
from training.io.atomic import write_json


def eval_command(
    model: Annotated[Path, typer.Option("--model", help="Local target model directory (transformers).")],
    draft: Annotated[Path, typer.Option("--draft", help="Exported draft directory (curator export).")],
    prompts: Annotated[Path, typer.Option("--prompts", help="Mix directory (parquet), JSONL {id, category, messages} or a text file (one prompt a line).")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Draft tokens per round (K).")] = 3,
    topk: Annotated[int, typer.Option("--topk", min=1, help="1: a chain; >1: a tree, grown as SGLang's --speculative-eagle-topk.")] = 1,
    num_draft_tokens: Annotated[Optional[int], typer.Option("--num-draft-tokens", min=2, help="Tokens verified per round, as SGLang's num-draft-tokens setting (default: steps+1; required for a tree).")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Tokens generated per prompt.")] = 256,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="At most this many prompts, spread over categories.")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Hidden-state store: adds the offline estimates on the samples the draft never trained on (the split is read from its checkpoint).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the full report here.")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cuda or cpu (default: cuda when present).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32 or bfloat16.")] = "float32",
    tie_margin: Annotated[Optional[float], typer.Option("--tie-margin", help="Logit margin under which a greedy divergence counts as a numerical tie (default 1e-4 in float32, 0.1 in bfloat16).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="0: greedy verification, output checked against greedy decoding. >0: the target samples and verifies as SGLang does (target-only speculative sampling); match the server's sampling settings.")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Top-p of the sampled verification (with --temperature).")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="Top-k of the sampled verification, 0 for off (with --temperature).")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampled verification: each prompt draws from its own generator.")] = 0,
    profile: Annotated[Optional[Path], typer.Option("--profile", help="Traffic profile (curator profile): adds acceptance per traffic category and weighted by the traffic's shares.")] = None,
) -> int:
    """Measure acceptance length with real speculative decoding (the target verifies, greedy or sampled)."""
    # Cheap inputs first: a path that is not there is named before torch is imported or a weight is read.
    for flag, path in (("--model", model), ("--draft", draft), ("--prompts", prompts), ("--data", data),
                       ("--profile", profile)):
        if path is not None and not path.exists():
            raise ConfigError(f"{flag} {path}: no such file or folder")
    import torch

    from curator.evaluation.weighting import eval_weights
    from training.eval.evaluate import load_target
    from training.eval.prompts import held_out_split, load_prompt_file, spread_by_category
    from training.eval.sampling import Sampling
    from training.drafts.registry import load_export

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise ConfigError(f"--dtype {dtype!r}: use one of {', '.join(dtypes)}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # bf16 rounds logits of order 10 to ~0.06: batched and one-token forwards may break such ties apart
    tie_margin = tie_margin if tie_margin is not None else (1e-4 if dtype == "float32" else 0.1)
    if not (0 <= temperature < float("inf")) or not 0 < top_p <= 1 or not 0 <= seed < 2**32:
        raise ConfigError(f"--temperature {temperature} must be >= 0, --top-p {top_p} in (0, 1] "
                          f"and --seed {seed} in [0, 2**32)")
    if temperature == 0 and (top_p < 1 or top_k > 0):
        raise ConfigError("--top-p/--top-k shape sampled verification: give --temperature too (0 is greedy)")
    sampling = Sampling(temperature, top_k=top_k, top_p=top_p, seed=seed) if temperature > 0 else None
    if topk > 1 and num_draft_tokens is None:
        raise ConfigError("--topk > 1 needs --num-draft-tokens: give the server's --speculative-num-draft-tokens")
    split = held_out_split(draft) if data is not None else None  # refuse before the long decoding
    weights = eval_weights(profile, prompts if prompts.is_dir() else None) if profile is not None else None
    from curator.mix.prompts import mix_prompts  # reads the mix package (datasketch, scipy): only a run pays

    all_prompts, malformed = mix_prompts(prompts) if prompts.is_dir() else load_prompt_file(prompts)
    chosen = spread_by_category(all_prompts, limit)
    if not chosen:
        raise ConfigError(f"no usable prompts in {prompts} ({malformed} malformed)")
    drafter = load_export(draft, model)  # before the target: a broken export is refused in a second, not minutes
    quiet_library_progress()  # transformers' "Loading weights" bar would cut into the eval's own lines
    target, tokenizer = load_target(model, device, dtypes[dtype])
    drafter = drafter.to(device=device, dtype=dtypes[dtype])

    start = time.perf_counter()
    report = measure(target, tokenizer, drafter, chosen, steps=steps, max_new_tokens=max_new_tokens,
                     tie_margin=tie_margin, topk=topk, num_draft_tokens=num_draft_tokens, sampling=sampling,
                     weights=weights, offline=(data, model, split) if data is not None and split is not None else None)
    if malformed:
        report.skipped["malformed rows"] = malformed
    render_eval(report, time.perf_counter() - start)
    if weights is not None:
        render_traffic(report, weights.source)
    if json_out is not None:
        extra = {"profile": str(profile)} if profile is not None else {}
        write_json(json_out, {"model": str(model), "draft": str(draft), "prompts": str(prompts), **extra, **report.to_json()})
        console.print(f"report written to {json_out}")
    return 0


def render_eval(report: Any, wall_s: float) -> None:
    """Print the summary, per-position and per-category tables."""
    from training.eval.evaluate import finite

    overall = report.overall
    rows: list[tuple[str, Any]] = [
        ("prompts decoded", len(report.prompts)),
        ("prompts skipped", sum(report.skipped.values())),
        ("new tokens", report.new_tokens),
        ("target verify forwards", overall.forwards),
        (f"acceptance length (K={report.steps}, topk={report.topk})", overall.acceptance_length),
    ]
    offline = report.offline or {}
    sim = offline.get("simulated") or {}
    teacher = offline.get("teacher_forced") or {}
    if offline:
        rows += [(f"offline, simulated decoding ({offline['samples']} held-out samples)", sim.get("acceptance_length")),
                 ("offline, teacher-forced (overstates)", teacher.get("accept_length"))]
    if report.sampling is None:
        rows.append(("output == greedy", "all prompts" if not report.ties else f"all, {report.ties} near-tie divergence(s)"))
    else:
        s = report.sampling
        rows.append(("verification", f"sampled: temperature {s.temperature:g}, top-p {s.top_p:g}, "
                                     f"top-k {s.top_k or 'off'}, seed {s.seed}"))
    rows.append(("wall time (s)", wall_s))
    console.print(summary_table("curator eval", rows))
    for reason, count in sorted(report.skipped.items()):
        console.print(f"[yellow]skipped {count}: {escape(reason)}[/]")
    if offline:
        console.print(f"offline samples: {escape(str(offline['split']))}")
        agreement = sim.get("greedy_agreement")
        if report.sampling is not None and agreement is not None and agreement >= 0.99:
            console.print("[yellow]the stored answers are the target's greedy choices: the simulated figure is greedy "
                          "acceptance; for acceptance at this temperature, regenerate the held-out answers with it "
                          "(curator generate --temperature)[/]")
        elif agreement is not None and agreement < 0.99:
            console.print(f"[yellow]only {agreement:.1%} of the stored answer tokens are the target's greedy choice: "
                          "a sampled continuation; the simulated figure judges the draft against the sampled tokens[/]")

    sim_rates = [r["rate"] for r in (sim.get("overall") or {}).get("per_position", [])]
    cond = teacher.get("cond_acc") or []
    prefix, run = [], 1.0
    for c in cond:
        run *= c
        prefix.append(run)
    position_rows = []
    for r in finite(overall.position_rates()):
        k = r["position"] - 1
        row = [r["position"], r["rate"], r["conditional"]]
        if offline:  # without --data there is nothing simulated: no empty columns
            row += [sim_rates[k] if k < len(sim_rates) else None, prefix[k] if k < len(prefix) else None]
        position_rows.append(row)
    # short headers, read whole at 80 columns; the line under the table says what they mean
    headers = ["position k", "measured", "given 1..k-1"] + (["simulated", "teacher-forced"] if offline else [])
    console.print(rows_table(headers, position_rows, title="acceptance per draft position"))
    console.print("[dim]measured" + (", simulated, teacher-forced" if offline else "")
                  + ": share of rounds accepting tokens 1..k; given 1..k-1: token k once 1..k-1 were accepted[/]")
    per_category = category_rows(report)
    columns = ["category", "forwards", "measured"]
    if offline:
        columns += ["simulated", "sim. forwards"]
    else:
        per_category = [row[:3] for row in per_category]
    console.print(rows_table(columns, per_category, title="acceptance length per category"))


def render_traffic(report: Any, source: str) -> None:
    """Print acceptance per traffic category and weighted by the profile's shares, measured and simulated."""
    from training.eval.evaluate import finite

    measured = report.traffic or {}
    simulated = (report.offline or {}).get("traffic_weighted") or {}
    rows = []
    for cat, m in measured["categories"].items():
        s = (simulated.get("categories") or {}).get(cat) or {}
        rows.append([cat, m["share"], m["weight"], m["forwards"], finite(m["acceptance_length"]),
                     s.get("weight") if s else None, finite(s.get("acceptance_length")) if s else None])
    rows.append(["weighted", None, 1.0, sum(r[3] for r in rows), finite(measured["acceptance_length"]),
                 1.0 if simulated else None, finite(simulated.get("acceptance_length")) if simulated else None])
    columns = ["traffic", "share", "weight", "forwards", "measured", "sim weight", "simulated"]
    if not simulated:  # no --data: no empty simulated columns
        columns, rows = columns[:5], [row[:5] for row in rows]
    console.print(rows_table(columns, rows, title=f"acceptance length on the traffic (profile {source})"))
    for label, part in (("measured", measured), ("simulated", simulated)):
        if part.get("missing"):
            what = "prompts" if label == "measured" else "held-out samples"
            console.print(f"[yellow]{label}: no {what} for {escape(', '.join(part['missing']))}; "
                          "weights renormalised over the rest[/]")
        if part.get("unweighted"):
            console.print(f"[yellow]{label}: {escape(', '.join(part['unweighted']))}: no traffic category, "
                          "not weighted[/]")


def category_rows(report: Any) -> list[list[Any]]:
    """Return per category: measured forwards and acceptance length beside the simulated ones."""
    from training.eval.evaluate import finite

    sim = ((report.offline or {}).get("simulated") or {}).get("categories") or {}
    names = sorted(set(report.categories) | set(sim))
    rows = []
    for name in names:
        measured = report.categories.get(name)
        s = sim.get(name) or {}
        rows.append([name, measured.forwards if measured else 0,
                     finite(measured.acceptance_length) if measured else None,
                     finite(s.get("acceptance_length")), s.get("forwards", 0)])
    return rows


def register(app: typer.Typer) -> None:
    """Add `eval` to the CLI."""
    app.command("eval")(eval_command)
