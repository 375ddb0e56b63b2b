"""Benchmark: do ten scout agents really run at once?

Ten agents of twelve turns each talk to a local Anthropic-API model server that takes 300 ms
per answer and a local Hub + dataset viewer that takes 50 ms per request, recording into a
real catalog. The run's wall time is compared with the slowest of those agents run alone
(fresh Hub cache, fresh catalog): perfect concurrency gives 1.0x; the goal is at most 1.2x.

    python bench/scout_bench.py                      # the numbers in the report
    python bench/scout_bench.py --agents 10 --turns 12 --model-latency 0.3 --hub-latency 0.05 --out result.json

Also reported: the run's wall time against its own slowest agent (the orchestrator's overhead),
the time agents spent waiting on tools, per tool, and how many model requests were in flight
at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from curator.catalog import Catalog  # noqa: E402
from curator.hub import LiveHub  # noqa: E402
from curator.llm import AnthropicClient  # noqa: E402
from curator.scout.agent import AgentBudget  # noqa: E402
from curator.scout.briefs import Brief, categories, load_briefs  # noqa: E402
from curator.scout.orchestrator import ScoutConfig, ScoutRun  # noqa: E402
from tests.fakes.hub_server import FakeDataset, FakeHubServer  # noqa: E402
from tests.fakes.llm_servers import API_KEY, ScriptedLLMServer, explorer  # noqa: E402


def bench_datasets(briefs: list[Brief], per_category: int = 4) -> list[FakeDataset]:
    """Return a few datasets per brief category, each with a card, splits and rows."""
    out = []
    for category in sorted({b.category for b in briefs}):
        for i in range(per_category):
            out.append(FakeDataset(
                id=f"org{i}/{category}-prompts-{i}",
                downloads=10_000 * (per_category - i),
                tags=["license:apache-2.0", "task_categories:text-generation"],
                card_data={"license": "apache-2.0", "task_categories": ["text-generation"]},
                readme=f"---\nlicense: apache-2.0\n---\n# {category} prompts\n" + "Prompts written by users. " * 40,
                splits=[("default", "train", 20_000)],
                features={"messages": "list<struct<role: string, content: string>>"},
                rows=[{"messages": [{"role": "user", "content": f"{category} prompt {j}"}]} for j in range(3)],
            ))
    return out


async def scout_once(briefs: list[Brief], all_briefs: list[Brief], hub_url: str, llm_url: str, turns: int, workdir: Path) -> ScoutRun:
    """Run the given agents once with a fresh Hub client and catalog; return the finished run."""
    catalog = Catalog.open(Path(tempfile.mkdtemp(dir=workdir)) / "catalog.duckdb")
    hub = LiveHub(endpoint=hub_url, viewer_url=hub_url, cache_dir=workdir / "hf-cache")
    client = AnthropicClient("bench-model", api_key=API_KEY, base_url=llm_url)
    config = ScoutConfig(model="bench-model", budget=AgentBudget(max_turns=turns), live=False)
    run = ScoutRun(catalog, hub, briefs, config, client, categories(all_briefs))
    try:
        return await run.run()
    finally:
        await client.aclose()
        await hub.aclose()


def tool_waits(run: ScoutRun) -> dict[str, float]:
    """Return the mean tool latency in ms per tool from the run's audit log."""
    _, rows = run.catalog.query(
        "SELECT tool, avg(latency_ms) FROM tool_calls WHERE run_id = ? GROUP BY tool ORDER BY tool", [run.run_id]
    )
    return {tool: round(ms, 1) for tool, ms in rows}


def max_in_flight(server: ScriptedLLMServer) -> int:
    """Return the most model requests the server had in flight at once."""
    events = sorted([(r.start, 1) for r in server.log] + [(r.end, -1) for r in server.log])
    best = now = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--model-latency", type=float, default=0.3)
    parser.add_argument("--hub-latency", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=None, help="Write the results as JSON here.")
    args = parser.parse_args(argv)

    all_briefs = load_briefs(ROOT / "agents")
    briefs = all_briefs[: args.agents]
    with tempfile.TemporaryDirectory() as tmp, FakeHubServer(bench_datasets(all_briefs), delay_s=args.hub_latency) as hub, \
            ScriptedLLMServer(latency=args.model_latency, default_script=explorer(turns=args.turns)) as llm:
        workdir = Path(tmp)
        # warm imports and connections once, so neither measured run pays for them
        asyncio.run(scout_once(briefs[:1], all_briefs, hub.url, llm.anthropic_url, 2, workdir))
        llm.log.clear()

        start = time.perf_counter()
        together = asyncio.run(scout_once(briefs, all_briefs, hub.url, llm.anthropic_url, args.turns, workdir))
        together_wall = time.perf_counter() - start
        in_flight = max_in_flight(llm)
        slowest = max(together.progress, key=lambda p: p.wall_s)

        solo_brief = next(b for b in briefs if b.id == slowest.agent)
        start = time.perf_counter()
        alone = asyncio.run(scout_once([solo_brief], all_briefs, hub.url, llm.anthropic_url, args.turns, workdir))
        alone_wall = time.perf_counter() - start
        waits_together, waits_alone = tool_waits(together), tool_waits(alone)

    states = sorted({p.state for p in together.progress})
    result = {
        "command": "python bench/scout_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "agents": len(briefs),
        "turns": args.turns,
        "model_latency_s": args.model_latency,
        "hub_latency_s": args.hub_latency,
        "states": states,
        "candidates": sum(p.candidates for p in together.progress),
        "run_wall_s": round(together.wall_s, 3),
        "run_wall_with_setup_s": round(together_wall, 3),
        "slowest_agent_in_run": slowest.agent,
        "slowest_agent_in_run_s": round(slowest.wall_s, 3),
        "median_agent_in_run_s": round(statistics.median(p.wall_s for p in together.progress), 3),
        "same_agent_alone_s": round(alone.progress[0].wall_s, 3),
        "same_agent_alone_run_wall_s": round(alone.wall_s, 3),
        "same_agent_alone_with_setup_s": round(alone_wall, 3),
        "ratio_run_vs_slowest_alone": round(together.wall_s / alone.wall_s, 3),
        "ratio_run_vs_slowest_in_run": round(together.wall_s / slowest.wall_s, 3),
        "model_floor_s": round(args.turns * args.model_latency, 3),
        "max_model_requests_in_flight": in_flight,
        "tool_latency_ms_together": waits_together,
        "tool_latency_ms_alone": waits_alone,
    }
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    verdict = "meets" if result["ratio_run_vs_slowest_alone"] <= 1.2 else "misses"
    print(f"\n{verdict} the goal: ten agents take {result['ratio_run_vs_slowest_alone']}x the slowest agent alone (goal <= 1.2x)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
