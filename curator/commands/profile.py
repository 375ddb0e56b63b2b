"""`curator profile`: profile a sample of the target's traffic (what it is asked) into PROFILE.json."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import JustifyMethod
from rich.markup import escape
from rich.progress import TaskID
from rich.table import Table
from rich.text import Text

from curator.llm import DEFAULT_TIMEOUT_S
from curator.ui import console, progress, stdout, summary_table

BAR_WIDTH = 24


def profile_command(
    traffic: Path = typer.Option(..., "--traffic", help="Request log (JSONL, one request a line; {body: ...} records too), a folder of them, a mix folder, or parquet/JSONL with `messages`."),
    out: Path = typer.Option(..., "--out", help="Profile file to write (JSON)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Target tokenizer folder: lengths in target tokens (default: characters)."),
    llm: Optional[str] = typer.Option(None, "--llm", help="anthropic or openai: a model classifies the rows the rules leave unsure (default: rules only)."),
    model: Optional[str] = typer.Option(None, "--model", help="With --llm: the model name (default: $CURATOR_MODEL, else claude-sonnet-4-5 for anthropic)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="With --llm openai: the server's /v1 address; with anthropic it overrides ANTHROPIC_BASE_URL."),
    llm_max: int = typer.Option(1000, "--llm-max", min=1, help="With --llm: at most this many unsure rows go to the model (the rest keep the rules' category)."),
    max_attempts: int = typer.Option(8, "--max-attempts", min=1, help="With --llm: tries per model call before the profile fails."),
    request_timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S, "--request-timeout", min=0.001,
        help="With --llm: seconds one model call may take, from sending to its answer's last byte, before it is retried.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the examples' sample."),
    no_examples: bool = typer.Option(False, "--no-examples", help="Keep no example requests in the profile or on the console (only counts and statistics leave the traffic)."),
) -> None:
    """Profile a traffic sample: categories, lengths, turns, tool use, languages, matching features."""
    from curator.llm import DEFAULT_RETRY, make_client
    from curator.traffic.profile import build_profile, write_profile

    client = None
    if llm is not None:
        retry = dataclasses.replace(DEFAULT_RETRY, max_attempts=max_attempts)
        # a missing key fails before the traffic is read
        client = make_client(llm, model, base_url, retry=retry, timeout_s=request_timeout)
    with progress() as bar:
        tasks: list[TaskID] = []  # added with the first rows read: an input refused before any draws no `0/?` bar

        def advance(n: int) -> None:
            if not tasks:
                tasks.append(bar.add_task("profiling", total=None))
            bar.update(tasks[0], completed=n)

        profile = build_profile(traffic, tokenizer=tokenizer, llm=client, llm_max=llm_max, seed=seed,
                                progress=advance)
    if no_examples:  # the scrubber cannot find every name mentioned in passing; counts alone can leave
        examples = (profile.model_extra or {}).get("examples") or {}  # a statistic the schema keeps as an extra
        profile = profile.model_copy(update={"examples": {cat: [] for cat in examples}})
    write_profile(profile, out)
    render(profile.model_dump(mode="json"), out)


def category_table(data: dict[str, Any]) -> Table:
    """Return the categories with rows, share and a bar each (fits in 80 columns)."""
    table = Table(title="traffic by category", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("category", "left"), ("rows", "right"), ("share", "right"), ("", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for name, entry in data["categories"].items():
        filled = round(entry["share"] * BAR_WIDTH)
        bar = Text("█" * filled, style="cyan") + Text("·" * (BAR_WIDTH - filled), style="dim")
        table.add_row(name, f"{entry['rows']:,}", f"{entry['share']:.1%}", bar)
    return table


def render(data: dict[str, Any], out: Path) -> None:
    """Print the profile: categories with bars, who decided, lengths and the rest, examples (all scrubbed)."""
    stdout.print(category_table(data))
    decided, length, context, turns = data["decided"], data["length"], data["context"], data["turns"]
    rows = [
        ("requests", data["rows"]),
        ("malformed (skipped)", data["malformed"]),
        ("decided by rules", decided["rules"]),
        ("decided by llm", decided["llm"] if data["classifier"]["llm"] else "off (no --llm)"),
        ("rules unsure", decided["rules_unsure"]),
        (f"prompt p50/p90/p99 ({length['unit']})", f"{length['p50']:,.0f} / {length['p90']:,.0f} / {length['p99']:,.0f}"),
        ("past 2K / 8K / 32K", f"{context['past_2k']:.1%} / {context['past_8k']:.1%} / {context['past_32k']:.1%}"),
        ("user turns mean / max", f"{turns['mean']:.2f} / {turns['max']:,.0f}"),
        ("multi-turn", f"{turns['multi_turn']:.1%}"),
        ("tool use", f"{data['tool_use']['rate']:.1%}"),
        ("non-English", f"{data['non_english']['share']:.1%}"),
        ("profile", str(out)),
    ]
    stdout.print(summary_table("traffic profile", rows))
    if context["unit"] != "tokens":
        console.print("[dim]context: estimated tokens (characters / 4); --tokenizer DIR counts them[/]")
    console.print("[dim]non-English: a script and stopword heuristic (non_english.method)[/]")
    if data["malformed"]:
        console.print(f"[yellow]skipped {data['malformed']:,} malformed:[/]")
        for reason, n in list(data["malformed_reasons"].items())[:5]:
            line = f"{n:>8,}  {reason}"
            console.print(escape(line if len(line) <= 78 else line[:77] + "…"), highlight=False)
    examples = [(cat, text) for cat, texts in data["examples"].items() for text in texts[:1]]
    if examples:
        table = Table(title="one example per category (scrubbed)", title_justify="left", show_header=False)
        table.add_column("category", no_wrap=True)
        table.add_column("example", overflow="ellipsis", no_wrap=True, max_width=60)
        for cat, text in examples:
            table.add_row(cat, Text(text))
        stdout.print(table)


def register(app: typer.Typer) -> None:
    """Add `profile` to the CLI."""
    app.command("profile")(profile_command)
