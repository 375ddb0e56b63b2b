"""`curator scout`: send research agents to the Hub and propose a mix from what they find;
`curator hub snapshot`: save what the tools need from the Hub for offline runs."""

from __future__ import annotations

import asyncio
import dataclasses
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from curator.catalog import Catalog
from curator import http
from curator.aio import cancel_on_sigterm
from curator.errors import ConfigError, CuratorError, HubError, LLMError
from curator.hub import HubClient, LiveHub, build_snapshot, open_hub
from curator.llm import DEFAULT_RETRY, DEFAULT_TIMEOUT_S, LLMClient, make_client
from curator.scout.agent import AgentBudget
from curator.scout.briefs import Brief, categories, load_briefs, take
from curator.scout.orchestrator import DEFAULT_GOAL, ScoutConfig, ScoutRun
from curator.scout.proposal import merge_candidates, propose_mix, write_proposal
from curator.scout.traffic_shares import TrafficShares, take_for_traffic
from curator.ui import compact_table, console, summary_table

# Hub calls of huggingface_hub are blocking and run in threads; ten agents need more than the
# default pool (cpu + 4) or they queue behind each other.


class Planner(str, Enum):
    llm = "llm"
    rules = "rules"


class LLMKind(str, Enum):
    anthropic = "anthropic"
    openai = "openai"


hub_app = typer.Typer(help="Hub access without the agents: offline snapshots.", no_args_is_help=True)


def scout(
    agents: Optional[int] = typer.Option(None, "--agents", "-n", help="How many agents to run, one per research domain's brief (agents/*.md), heaviest first (default: all)."),
    goal: str = typer.Option(DEFAULT_GOAL, "--goal", help="What every agent looks for.",
                             show_default="agentic coding, tool use, chat"),
    planner: Planner = typer.Option(Planner.llm, "--planner", help="llm: model agents; rules: seed queries and a transparent score, no model."),
    llm: LLMKind = typer.Option(LLMKind.anthropic, "--llm", help="anthropic (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL) or openai (any OpenAI-compatible server)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: $CURATOR_MODEL, else claude-sonnet-4-5 for anthropic)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Server URL for --llm openai (its /v1 address); with anthropic it overrides ANTHROPIC_BASE_URL."),
    hub: Optional[str] = typer.Option(None, "--hub", help="Hub snapshot file for offline runs ('bundled' for the shipped one); default: the live Hub (HF_ENDPOINT, HF_TOKEN)."),
    max_turns: int = typer.Option(12, "--max-turns", min=1, help="Model calls per agent."),
    max_tokens: int = typer.Option(300_000, "--max-tokens", min=1, help="Tokens (input + output) per agent."),
    target_samples: int = typer.Option(100_000, "--target-samples", min=1, help="Size of the proposed mix."),
    recipe_out: Optional[Path] = typer.Option(None, "--recipe-out", help="Where to write the proposed recipe (default: a file named after the recipe, in recipes/)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Catalog file (default: $CURATOR_CATALOG or ./catalog.duckdb)."),
    agents_dir: Optional[Path] = typer.Option(None, "--agents-dir", help="Folder of research briefs, one Markdown file per data domain (default: $CURATOR_AGENTS_DIR or ./agents)."),
    no_live: bool = typer.Option(False, "--no-live", help="Leave out the live table of agents (for logs)."),
    request_timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S, "--request-timeout", min=0.001,
        help="Seconds one model call may take, from sending to its answer's last byte, before it counts as a "
             "transient failure (retried).",
    ),
    max_attempts: int = typer.Option(
        DEFAULT_RETRY.max_attempts, "--max-attempts", min=1,
        help="Tries per model call, the first included, before the agent fails.",
    ),
    profile: Optional[Path] = typer.Option(
        None, "--profile", help="Traffic profile (curator profile): agents and quotas follow its category shares.",
    ),
) -> None:
    """Run research agents on the Hub, record their finds in the catalog and propose a recipe."""
    all_briefs = load_briefs(agents_dir)
    traffic = TrafficShares.load(profile) if profile is not None else None
    if agents is not None and agents > len(all_briefs):
        raise ConfigError(f"--agents {agents}: only {len(all_briefs)} research briefs (one file per data domain) in the agents folder; add a brief per extra domain")
    chosen = take(all_briefs, agents) if traffic is None else _take_for_traffic(all_briefs, agents, traffic)
    # the model client first: a missing key should fail before anything touches the Hub or catalog
    retry = dataclasses.replace(DEFAULT_RETRY, max_attempts=max_attempts)
    client: LLMClient | None = (
        make_client(llm.value, model, base_url, retry=retry, timeout_s=request_timeout) if planner is Planner.llm else None
    )
    hub_client = open_hub(hub)
    if isinstance(hub_client, LiveHub):  # seconds to say so, not minutes of huggingface_hub's retries
        hub_client.require_reachable()
    if client is not None:  # likewise, not a minute of retries in every agent
        why = http.unreachable(client.endpoint)
        if why is not None:
            raise LLMError(f"cannot reach the agents' model server at {http.public_url(client.endpoint)} ({why}); "
                           "check --base-url (or ANTHROPIC_BASE_URL) and the network, or use --planner rules")
    cat = Catalog.open(catalog)
    config = ScoutConfig(
        goal=goal, planner=planner.value, model=client.model if client else None,
        budget=AgentBudget(max_turns=max_turns, max_tokens=max_tokens), target_samples=target_samples, live=not no_live,
    )
    run = ScoutRun(cat, hub_client, chosen, config, client, sorted(categories(all_briefs)))
    try:
        asyncio.run(_run(run, hub_client, client))
    except (KeyboardInterrupt, asyncio.CancelledError):
        _print_summary(run, None)
        console.print(f"[yellow]interrupted:[/] kept {_recorded(run)} candidates of run {run.run_id} in {escape(str(cat.path))}")
        raise typer.Exit(130) from None
    if _recorded(run) == 0 and hub_client.stats.all_failed():
        raise HubError(f"no candidates: all {hub_client.stats.fetches} Hub requests failed; the first said: "
                       f"{hub_client.stats.first_error}")
    recipe = _propose(cat, run, all_briefs, goal, target_samples, recipe_out, traffic)
    _print_summary(run, recipe)
    if run.status == "failed":
        first = next((p.error for p in run.failed if p.error), "unknown error")
        raise CuratorError(f"every agent failed; the first said: {first}")


async def _run(run: ScoutRun, hub: HubClient, client: LLMClient | None) -> None:
    # SIGTERM (a scheduler, `kill`) ends the run as Ctrl-C does: agents cancelled, rows written,
    # the run recorded as cancelled instead of left `running`.
    with cancel_on_sigterm():  # off the main thread (the CLI run in a thread) the caller's own signals apply
        try:
            await run.run()
        finally:
            await hub.aclose()
            if client is not None:
                await client.aclose()


def _recorded(run: ScoutRun) -> int:
    return sum(p.candidates for p in run.progress)


def _take_for_traffic(briefs: list[Brief], agents: Optional[int], traffic: TrafficShares) -> list[Brief]:
    chosen, counts, notes = take_for_traffic(briefs, agents, traffic)
    split = ", ".join(f"{c} {n}" for c, n in counts.items())
    console.print(f"agents by traffic ({escape(traffic.source)}): {escape(split)}", highlight=False)
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    return chosen


def _propose(cat: Catalog, run: ScoutRun, briefs: list[Brief], goal: str, target: int, out: Optional[Path],
             traffic: TrafficShares | None = None) -> Path | None:
    merged = merge_candidates(cat, run.run_id)
    if not merged:
        console.print("[yellow]no candidates recorded; no recipe proposed[/]")
        return None
    proposal = propose_mix(merged, briefs, goal, target, run_id=run.run_id, traffic=traffic)
    for note in proposal.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    path = write_proposal(proposal, out)
    console.print(
        compact_table(
            ("dataset", "category", "samples", "reason"),
            [(q.dataset_id, q.category, q.samples, q.reason) for q in proposal.quotas],
            title=f"proposed recipe ({proposal.total():,} of {target:,} samples; each reason is in {path})",
            optional=("reason",),
        )
    )
    return path


def _print_summary(run: ScoutRun, recipe: Path | None) -> None:
    finished = sum(1 for p in run.progress if p.state == "finished")
    rows = [
        ("run", run.run_id),
        ("status", run.status),
        ("agents finished / run", f"{finished} / {len(run.progress)}"),
        ("agents failed", len(run.failed)),
        ("candidates recorded", _recorded(run)),
        ("datasets found", len(run.top_candidates(limit=10_000))),
        ("input tokens", run.input_tokens),
        ("output tokens", run.output_tokens),
        ("wall time (s)", round(run.wall_s, 1)),
    ]
    if recipe is not None:
        rows.append(("proposed recipe", str(recipe)))
    console.print(summary_table("scout", rows))
    for p in run.failed:
        console.print(f"[red]{escape(p.agent)} failed:[/] {escape(p.error or '')}", highlight=False)


def snapshot(
    out: Path = typer.Option(..., "--out", help="Snapshot file to write (JSON)."),
    query: Optional[list[str]] = typer.Option(None, "--query", "-q", help="A search to save (repeatable; default: every brief's seed queries)."),
    dataset: Optional[list[str]] = typer.Option(None, "--dataset", help="A dataset id to save even if no search finds it (repeatable)."),
    per_query: int = typer.Option(10, "--per-query", min=1, max=100, help="Hits saved (and inspected) per search."),
    agents_dir: Optional[Path] = typer.Option(None, "--agents-dir", help="Folder of research briefs (one Markdown file per data domain) whose seed queries are saved by default."),
) -> None:
    """Save the Hub metadata the agents' tools need for a set of searches (for `scout --hub FILE`)."""
    queries = list(query or []) or [q for b in load_briefs(agents_dir) for q in b.seed_queries]

    live_hub = LiveHub()
    live_hub.require_reachable()

    async def go():
        try:
            return await build_snapshot(live_hub, queries, out, per_query=per_query, extra_ids=dataset or ())
        finally:
            await live_hub.aclose()

    summary = asyncio.run(go())
    console.print(summary_table("hub snapshot", [
        ("file", str(summary.path)), ("searches", summary.queries), ("datasets", summary.datasets),
        ("failed", len(summary.failed)), ("wall time (s)", round(summary.wall_s, 1)),
    ]))
    for line in summary.failed[:20]:
        console.print(f"[yellow]failed:[/] {escape(line)}", highlight=False)


hub_app.command("snapshot")(snapshot)


def register(app: typer.Typer) -> None:
    """Add `scout` and `hub` to the CLI."""
    app.command("scout")(scout)
    app.add_typer(hub_app, name="hub")
