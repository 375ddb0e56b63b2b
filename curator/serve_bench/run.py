"""Run a prompt set against the draft's endpoint (and a baseline without it), category by category,
at each concurrency, reading the engine's acceptance as it publishes it."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from curator import http
from curator.errors import ConfigError
from curator.serve_bench.client import (
    Endpoint,
    RequestResult,
    metrics_page,
    served_model,
    timed_request,
)
from curator.engines import ENGINES
from curator.serve_bench.report import GroupResult, ServeBenchReport, sglang_acceptance


@dataclass
class BenchPrompt:
    """One prompt: its category, its messages (vLLM) and its rendered token ids (SGLang)."""

    id: str
    category: str
    messages: list[dict[str, Any]]
    input_ids: list[int] | None = None

    def payload(self, engine: str) -> Any:
        if ENGINES[engine].BENCH_TAKES_TOKEN_IDS:
            if self.input_ids is None:
                raise ConfigError(f"a {engine} endpoint takes token ids: pass --tokenizer (the target's model directory)")
            return self.input_ids
        return self.messages


async def _group(client: httpx.AsyncClient, endpoint: Endpoint, label: str, prompts: Sequence[BenchPrompt],
                 concurrency: int, max_tokens: int, on_request: Callable[[RequestResult], None] | None,
                 temperature: float = 0.0) -> GroupResult:
    """Return one category's prompts run at `concurrency` against one endpoint."""
    read_counters = ENGINES[endpoint.engine].spec_counters if label == "draft" else None
    before = read_counters(await metrics_page(client, endpoint.url, endpoint.auth)) if read_counters is not None else None
    gate = asyncio.Semaphore(concurrency)

    async def one(p: BenchPrompt) -> RequestResult:
        async with gate:
            result = await timed_request(client, endpoint, p.category, p.payload(endpoint.engine), max_tokens,
                                         temperature)
        if on_request is not None:
            on_request(result)
        return result

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    group = GroupResult(label, concurrency, prompts[0].category or "all", list(results), wall)
    if read_counters is not None and before is not None:
        counted = read_counters(await metrics_page(client, endpoint.url, endpoint.auth)).minus(before)
        group.acceptance_length = counted.acceptance_length if counted.drafts else None
        group.position_rates = counted.position_rates()
    elif label == "draft":
        group.acceptance_length = sglang_acceptance(group.requests)
    return group


async def run_bench(
    draft: Endpoint, baseline: Endpoint | None, prompts: Sequence[BenchPrompt], *, concurrencies: Sequence[int],
    max_tokens: int, source: str, timeout_s: float = 600.0, warmup: int = 1,
    on_request: Callable[[RequestResult], None] | None = None, temperature: float = 0.0,
) -> ServeBenchReport:
    """Return the measurements of every (endpoint, concurrency, category) group.

    Groups run one after another, so each has the server to itself and vLLM's server-wide
    counters can be read around it; `warmup` requests per endpoint go first, unmeasured.
    """
    if not prompts:
        raise ConfigError("no prompts to send")
    if any(c < 1 for c in concurrencies):
        raise ConfigError(f"concurrency must be at least 1, not {list(concurrencies)}")
    by_category: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ConfigError(f"temperature {temperature}: use 0 (greedy) or a positive value")
    report = ServeBenchReport(source, max_tokens, temperature)
    limits = httpx.Limits(max_connections=max(concurrencies) + 2)
    # no retries: a benchmark that silently re-sent a request would time the retry, not the engine
    async with httpx.AsyncClient(timeout=http.timeout(timeout_s), limits=limits) as client:
        endpoints = [("draft", draft)] + ([("baseline", baseline)] if baseline is not None else [])
        resolved = []
        for label, ep in endpoints:
            if ENGINES[ep.engine].NEEDS_SERVED_MODEL_NAME and not ep.model:
                ep = ep.with_model(await served_model(client, ep.url, ep.auth))
            for p in prompts[:warmup]:
                await timed_request(client, ep, p.category, p.payload(ep.engine), min(max_tokens, 16), temperature)
            resolved.append((label, ep))
        for concurrency in concurrencies:
            for label, ep in resolved:
                for category in sorted(by_category):
                    report.groups.append(await _group(client, ep, label, by_category[category], concurrency,
                                                      max_tokens, on_request, temperature))
    return report


def bench_serve(draft: Endpoint, baseline: Endpoint | None, prompts: Sequence[BenchPrompt], **kwargs: Any) -> ServeBenchReport:
    """Return `run_bench`'s report, run on a fresh event loop (for the CLI and scripts)."""
    return asyncio.run(run_bench(draft, baseline, prompts, **kwargs))
