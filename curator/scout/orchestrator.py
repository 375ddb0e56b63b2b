"""The scout run: N agents on the Hub at once, each with its own budget, one catalog writer.

Each agent runs as its own asyncio task, so a slow model call or Hub request of one agent
never holds up the others, and one agent failing (its model refusing, a tool blowing up) is
recorded in its row while the rest carry on. All catalog rows go through one CatalogSink. When
the run is cancelled (Ctrl-C), the agents are cancelled, everything they already recorded is
written, their rows are marked "cancelled", and the run is closed as "cancelled".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from curator.catalog import AgentAccount, Catalog, new_run_id
from curator.errors import CuratorError
from curator.hub import HubClient
from curator.llm import LLMClient
from curator.scout.agent import (
    FAILED,
    FINISHED,
    AgentBudget,
    AgentProgress,
    elapsed,
    run_agent,
)
from curator.scout.briefs import Brief
from curator.scout.lease import RunLease, is_alive
from curator.scout.sink import CatalogSink
from curator.scout.tools import AgentToolbox
from curator.ui import compact_table
from curator.ui import console as default_console

DEFAULT_GOAL = (
    "prompts for agentic coding: multi-turn tool-use and software-engineering agent trajectories, "
    "coding instructions and debugging, plus reasoning and general chat for balance, to train an "
    "EAGLE-3 draft for a large reasoning model (e.g. Kimi-K2.5) whose responses will be regenerated"
)
PLANNERS = ("llm", "rules")
TOP_CANDIDATES_SHOWN = 12

# A rules agent: (brief, toolbox, goal, target_samples=) -> awaitable; it acts only through the toolbox.
RulesAgent = Callable[..., Awaitable[Any]]


@dataclass
class ScoutConfig:
    """What a scout run does: goal, planner, model name for the record, per-agent budget."""

    goal: str = DEFAULT_GOAL
    planner: str = "llm"
    model: str | None = None
    budget: AgentBudget = field(default_factory=AgentBudget)
    target_samples: int = 100_000  # the rules planner sizes its suggestions against this
    live: bool = True


class ScoutRun:
    """One scout run over a list of briefs. `await run.run()`; its state stays readable afterwards,
    including after cancellation (so a Ctrl-C can still be summarised)."""

    def __init__(
        self,
        catalog: Catalog,
        hub: HubClient,
        briefs: Sequence[Brief],
        config: ScoutConfig,
        client: LLMClient | None = None,
        categories: Sequence[str] | None = None,
        rules_agent: RulesAgent | None = None,
        console: Console | None = None,
    ) -> None:
        if config.planner not in PLANNERS:
            raise CuratorError(f"unknown planner {config.planner!r}; use one of {', '.join(PLANNERS)}")
        if config.planner == "llm" and client is None:
            raise CuratorError("the llm planner needs a model client (see --llm)")
        if not briefs:
            raise CuratorError("no agent briefs to run; add markdown briefs to agents/")
        self.catalog = catalog
        self.hub = hub
        self.briefs = list(briefs)
        self.config = config
        self.client = client
        self.categories = set(categories or {b.category for b in self.briefs})
        self.rules_agent = rules_agent
        self.console = console or default_console
        self.progress = [AgentProgress(b.id, b.category, b.title) for b in self.briefs]
        self.run_id: str | None = None
        self.status = "not started"
        self.started: float | None = None
        self.ended: float | None = None
        self.sink_errors: list[str] = []

    # -- accounting -------------------------------------------------------------------------

    @property
    def wall_s(self) -> float:
        """Return the run's wall time so far (or in total once ended)."""
        return elapsed(self.started, self.ended)

    @property
    def input_tokens(self) -> int:
        """Return the input tokens of all agents."""
        return sum(p.input_tokens for p in self.progress)

    @property
    def output_tokens(self) -> int:
        """Return the output tokens of all agents."""
        return sum(p.output_tokens for p in self.progress)

    @property
    def failed(self) -> list[AgentProgress]:
        """Return the agents that failed."""
        return [p for p in self.progress if p.state == FAILED]

    @property
    def errors(self) -> int:
        """Return failed agents plus catalog writes that failed."""
        return len(self.failed) + len(self.sink_errors)

    def top_candidates(self, limit: int = TOP_CANDIDATES_SHOWN) -> list[dict[str, Any]]:
        """Return the run's candidates merged per dataset, best relevance first."""
        merged: dict[str, dict[str, Any]] = {}
        for p in self.progress:
            for c in p.recorded:
                row = merged.setdefault(
                    c.dataset_id,
                    {"dataset_id": c.dataset_id, "category": c.category, "relevance": c.relevance, "samples": c.suggested_samples, "agents": []},
                )
                if c.relevance > row["relevance"]:
                    row.update(category=c.category, relevance=c.relevance)
                row["samples"] = max(row["samples"], c.suggested_samples)
                row["agents"].append(p.agent)
        rows = sorted(merged.values(), key=lambda r: (-r["relevance"], -len(r["agents"]), r["dataset_id"]))
        return rows[:limit]

    # -- running ----------------------------------------------------------------------------

    async def run(self) -> ScoutRun:
        """Run every agent to its end; return self. Cancellation records what was done, then propagates."""
        cfg = self.config
        self.started = time.perf_counter()
        self.run_id = new_run_id("scout")
        self._lease = RunLease(self.catalog.path, self.run_id)
        self._lease.hold()  # before the row says running, so that no other scout takes it for dead
        try:
            await asyncio.to_thread(self._start_row)
        except BaseException:
            self._lease.release()
            raise
        sink = CatalogSink(self.catalog)
        await sink.start()
        self.status = "running"
        tasks = [
            asyncio.create_task(self._run_one(brief, progress, sink), name=f"scout-agent-{brief.id}")
            for brief, progress in zip(self.briefs, self.progress)
        ]
        live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False) if cfg.live else None
        try:
            if live is not None:
                live.start()
            await self._wait(tasks, live)
            self.status = "failed" if len(self.failed) == len(self.progress) else "finished"
        except BaseException as exc:
            cancelled = isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit))
            self.status = "cancelled" if cancelled else "failed"
            for task in tasks:
                task.cancel()
            # let every agent mark itself cancelled before its row is written
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            self.ended = time.perf_counter()
            try:
                await self._record(sink)
            finally:
                # a row left `running` by a failed last write is marked aborted by the next scout
                self._lease.release()
                if live is not None:
                    live.update(self.render())
                    live.stop()
        return self

    def _start_row(self) -> None:
        cfg = self.config
        with self.catalog.session():  # one open of the file for the check and the insert
            stale = [r for r in self.catalog.running_scout_runs() if not is_alive(self.catalog.path, r)]
            if stale:
                # a run cut short (killed, a full disk) left part of what this run records again: its
                # candidates nobody reviewed go, so a rerun lists each find once (a reviewed one stays);
                # removed before the run is marked aborted, so a stop in between only repeats this
                with self.catalog.connect() as con:
                    con.executemany("DELETE FROM candidates WHERE run_id = ? AND status = 'proposed'",
                                    [[run_id] for run_id in stale])
            self.catalog.abort_scout_runs(stale)
            self.catalog.start_scout_run(cfg.goal, cfg.planner, cfg.model, len(self.briefs), run_id=self.run_id)

    async def _wait(self, tasks: list[asyncio.Task], live: Live | None) -> None:
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.25)
            if live is not None:
                live.update(self.render())
        for task in tasks:
            task.result()  # _run_one contains failures; anything here is a bug worth surfacing

    async def _run_one(self, brief: Brief, progress: AgentProgress, sink: CatalogSink) -> None:
        assert self.run_id is not None
        toolbox = AgentToolbox(self.hub, sink, self.run_id, brief.id, self.categories)
        progress.toolbox = toolbox
        try:
            if self.config.planner == "llm":
                assert self.client is not None
                await run_agent(brief, self.client, toolbox, self.config.goal, self.config.budget, progress)
            else:
                await self._run_rules(brief, toolbox, progress)
        finally:
            # the row goes into the writer's queue even when this agent is being cancelled
            await sink.agent(AgentAccount(
                self.run_id, progress.agent, progress.category, progress.turn, progress.input_tokens,
                progress.output_tokens, progress.candidates, progress.errors, progress.state,
                round(progress.wall_s, 3), progress.error,
            ))

    async def _run_rules(self, brief: Brief, toolbox: AgentToolbox, progress: AgentProgress) -> None:
        if self.rules_agent is None:
            from curator.scout.rules import run_rules_agent

            self.rules_agent = run_rules_agent
        try:
            with progress.running():
                await self.rules_agent(brief, toolbox, self.config.goal, target_samples=self.config.target_samples)
                progress.state = FINISHED
        finally:
            progress.turn = toolbox.stats.calls

    async def _record(self, sink: CatalogSink) -> None:
        # Shielded so that a second Ctrl-C during these last writes cannot lose them.
        async def close() -> None:
            await sink.stop()
            self.sink_errors = list(sink.stats.errors)
            assert self.run_id is not None
            await asyncio.to_thread(
                self.catalog.finish_scout_run, self.run_id, self.status, self.input_tokens,
                self.output_tokens, self.errors, round(self.wall_s, 3),
            )

        await asyncio.shield(close())

    # -- display ----------------------------------------------------------------------------

    def render(self) -> Group:
        """Return the live view: a row per agent, then the top candidates so far, each laid out for the
        terminal's width (ids and states whole; the domain, tokens and agents left out before anything is cut)."""
        budget = self.config.budget.max_turns
        agents = compact_table(
            ("agent", "state", "turn", "searches", "inspected", "candidates", "tokens", "domain"),
            [(p.agent, p.state, f"{p.turn}/{budget}" if self.config.planner == "llm" else p.turn, p.searches,
              p.inspections, p.candidates, p.tokens, p.domain) for p in self.progress],
            title=f"scout {self.run_id or ''}  {self.status}  {self.wall_s:.1f} s",
            whole=("agent", "state", "turn"), optional=("domain", "tokens"),
        )
        # an error is a sentence: on its own line, whole, not cut to 60 characters inside a cell
        errors = [Text(f"{p.agent}: {p.error}", style="red") for p in self.progress if p.error]
        top = compact_table(
            ("dataset", "category", "relevance", "samples", "agents"),
            [(row["dataset_id"], row["category"], f"{row['relevance']:.2f}", row["samples"], ", ".join(row["agents"]))
             for row in self.top_candidates()],
            title="top candidates", optional=("agents",),
        )
        return Group(agents, *errors, top)


async def run_scout(
    catalog: Catalog,
    hub: HubClient,
    briefs: Sequence[Brief],
    config: ScoutConfig,
    client: LLMClient | None = None,
    categories: Sequence[str] | None = None,
) -> ScoutRun:
    """Run a scout over `briefs` and return the finished run (see ScoutRun)."""
    return await ScoutRun(catalog, hub, briefs, config, client, categories).run()
