"""From the agents' finds to a proposed recipe: merge candidates across agents, then share a
target sample count among categories and datasets, each quota with its reason.

Shares follow the briefs' weights (the original case's agentic-heavy mix), multiplied by
GOAL_BOOST for categories the goal names, over the categories something was found for; with a
traffic profile (`scout --profile`), they follow the traffic's shares instead (curator.scout.traffic_shares).
Within a category, datasets share its quota by relevance (a little more when several agents
found the same dataset), never more than a dataset's rows; what a full dataset cannot take
flows to the others. Reasons go into the YAML as comments, because the recipe model rejects
unknown keys.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from curator.catalog import Catalog
from curator.errors import ConfigError
from training.io.atomic import write_text
from curator.scout.allocation import DEFAULT_WEIGHT, allocate, cap_sum
from curator.scout.briefs import Brief
from curator.scout.traffic_shares import TrafficShares, allocate_by_traffic, served_by, traffic_weights

GOAL_BOOST = 1.5
AGREEMENT_BONUS = 0.25  # per extra agent that found the same dataset
AGENTIC_CATEGORIES = {"agentic"}  # regenerate only the last answer: observations depend on actions
MODEL_FAMILIES = ("kimi", "deepseek", "qwen", "llama", "glm", "minimax", "mistral", "gemma")
_EVAL_SPLIT = re.compile(r"test|dev|valid|eval", re.I)


@dataclass
class MergedCandidate:
    """One dataset as all agents of the run(s) saw it."""

    dataset_id: str
    category: str  # the category of its most relevant finding
    relevance: float  # the best relevance any agent gave
    agents: list[str]
    findings: int
    rationales: list[tuple[str, float, str]]  # (agent, relevance, rationale), best first
    suggested_samples: int
    license: str | None = None
    num_rows: int | None = None
    configs: list[dict[str, Any]] = field(default_factory=list)


def merge_candidates(catalog: Catalog, run_id: str | None = None, include_rejected: bool = False) -> list[MergedCandidate]:
    """Return one entry per dataset across agents (of one run, or all runs), best first."""
    sql = (
        "SELECT c.dataset_id, c.agent, c.category, c.relevance, c.rationale, c.suggested_samples, c.status, "
        "d.license, d.num_rows, d.configs FROM candidates c LEFT JOIN datasets d USING (dataset_id)"
    )
    where, params = [], []
    if run_id is not None:
        where.append("c.run_id = ?")
        params.append(run_id)
    if not include_rejected:
        where.append("c.status <> 'rejected'")
    if where:
        sql += " WHERE " + " AND ".join(where)
    _, rows = catalog.query(sql + " ORDER BY c.relevance DESC, c.id", params or None)
    merged: dict[str, MergedCandidate] = {}
    for dataset_id, agent, category, relevance, rationale, samples, _status, license, num_rows, configs in rows:
        entry = merged.get(dataset_id)
        if entry is None:
            entry = merged[dataset_id] = MergedCandidate(
                dataset_id, category, float(relevance), [], 0, [], int(samples or 0), license,
                int(num_rows) if num_rows is not None else None, _json_list(configs),
            )
        entry.findings += 1
        if agent not in entry.agents:
            entry.agents.append(agent)
        entry.rationales.append((agent, float(relevance), rationale or ""))
        entry.suggested_samples = max(entry.suggested_samples, int(samples or 0))
    return sorted(merged.values(), key=lambda m: (-m.relevance, -len(m.agents), m.dataset_id))


def _json_list(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


@dataclass
class Quota:
    """One source of the proposed recipe and why it gets its samples."""

    dataset_id: str
    category: str
    samples: int
    split: str
    config: str | None
    turns: str | None
    keep_responses: bool
    reason: str
    license: str | None = None
    traffic: str | None = None  # the traffic category its category serves, when that is another one


@dataclass
class Proposal:
    """A proposed mix: category shares with reasons, and one quota per dataset."""

    name: str
    goal: str
    target_samples: int
    shares: dict[str, tuple[float, str]]  # category -> (share, reason)
    quotas: list[Quota]
    run_id: str | None = None
    notes: list[str] = field(default_factory=list)  # what the shares could not follow, and why

    def total(self) -> int:
        """Return the samples the quotas add up to (less than the target when datasets ran out)."""
        return sum(q.samples for q in self.quotas)


def _goal_words(goal: str) -> set[str]:
    return set(re.findall(r"[a-z0-9][a-z0-9.+#]*", goal.lower()))


def _named_by_goal(category: str, briefs: list[Brief], goal_words: set[str]) -> list[str]:
    names = set(re.split(r"[-_]", category)) & goal_words
    for brief in briefs:
        if brief.category == category:
            names |= {k.lower() for k in brief.keywords if k.lower() in goal_words}
    return sorted(names)


def _brief_weights(categories: list[str], briefs: list[Brief], goal_words: set[str]) -> tuple[dict[str, float], dict[str, str]]:
    """Return (weight, reason) per category: its brief's weight, times GOAL_BOOST where the goal names it."""
    weights = {b.category: b.weight for b in briefs}
    raw: dict[str, float] = {}
    reasons: dict[str, str] = {}
    for c in categories:
        base = weights.get(c, DEFAULT_WEIGHT)
        named = _named_by_goal(c, briefs, goal_words)
        raw[c] = base * (GOAL_BOOST if named else 1.0)
        reasons[c] = f"brief weight {base:.2f}" + (f" x{GOAL_BOOST} (goal names {', '.join(named)})" if named else "")
    return raw, reasons


def _pick_split(candidate: MergedCandidate) -> tuple[str | None, str]:
    if not candidate.configs:
        return None, "train"
    by_config: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in candidate.configs:
        by_config[str(s.get("config"))].append(s)
    # the config with the most rows (Mixture-of-Thoughts' `all`), else `default`, else the first
    def rows(config: str) -> int:
        return sum(int(s.get("num_rows") or 0) for s in by_config[config])

    config = max(by_config, key=lambda c: (rows(c), c == "default", -list(by_config).index(c)))
    splits = [str(s.get("split")) for s in by_config[config]]
    for preferred in ("train", "train_sft"):
        if preferred in splits:
            return (None if config == "default" else config), preferred
    usable = [s for s in splits if not _EVAL_SPLIT.search(s)] or splits
    return (None if config == "default" else config), usable[0]


def propose_mix(
    merged: list[MergedCandidate],
    briefs: list[Brief],
    goal: str,
    target_samples: int = 100_000,
    max_per_category: int = 4,
    name: str | None = None,
    run_id: str | None = None,
    traffic: TrafficShares | None = None,
) -> Proposal:
    """Return the proposed mix for `target_samples` from merged candidates, weighted toward the goal,
    or, with `traffic`, by the traffic profile's category shares (curator.scout.traffic_shares)."""
    if target_samples < 1:
        raise ConfigError(f"--target-samples must be at least 1, got {target_samples}")
    if not merged:
        raise ConfigError("no candidates to propose a mix from; run `curator scout` first (or approve fewer rejections)")
    weights = {b.category: b.weight for b in briefs}
    goal_words = _goal_words(goal)
    by_category: dict[str, list[MergedCandidate]] = defaultdict(list)
    for cand in merged:
        by_category[cand.category].append(cand)
    categories = sorted(by_category, key=lambda c: (-weights.get(c, DEFAULT_WEIGHT), c))
    for c in categories:
        by_category[c] = by_category[c][:max_per_category]

    if traffic is not None:
        raw, reasons, notes = traffic_weights(categories, briefs, traffic)
    else:
        raw, reasons, notes = *_brief_weights(categories, briefs, goal_words), []

    cat_caps = []
    for c in categories:
        cat_caps.append(cap_sum([m.num_rows for m in by_category[c]]))
    if traffic is not None:
        cat_samples = allocate_by_traffic(target_samples, categories, raw, cat_caps, briefs, traffic)
    else:
        cat_samples = allocate(target_samples, [raw[c] for c in categories], cat_caps)
    raw_sum = sum(raw.values())
    shares = {
        c: (n / target_samples, f"{reasons[c]}; {raw[c] / raw_sum:.1%} of the found categories' weight")
        for c, n in zip(categories, cat_samples)
    }

    family = [f for f in MODEL_FAMILIES if f in goal_words or any(w.startswith(f) for w in goal_words)]
    quotas: list[Quota] = []
    for c, n in zip(categories, cat_samples):
        cands = by_category[c]
        # written as the source's `traffic:`, so the mix records what a brief category serves
        served = served_by(c, briefs)
        traffic_of = served if served != c else None
        ds_weights = [m.relevance * (1 + AGREEMENT_BONUS * (len(m.agents) - 1)) for m in cands]
        amounts = allocate(n, ds_weights, [m.num_rows for m in cands])
        for m, amount, w in zip(cands, amounts, ds_weights):
            if amount <= 0:
                continue
            config, split = _pick_split(m)
            own_traces = next((f for f in family if f in m.dataset_id.lower()), None)
            more = f", +{len(m.agents) - 4} more" if len(m.agents) > 4 else ""
            agents = f"{len(m.agents)} agent{'s' if len(m.agents) > 1 else ''} ({', '.join(m.agents[:4])}{more})"
            best_agent, best_rel, best_why = m.rationales[0]
            basis = f" (traffic profile {traffic.source})" if traffic is not None else ""
            reason = (
                f"{amount:,} of {c}'s {n:,}{basis}: relevance {m.relevance:.2f} from {agents}, weight {w:.2f}"
                + (f", capped at its {m.num_rows:,} rows" if m.num_rows is not None and amount >= m.num_rows else "")
                + (f"; keep_responses: generated by {own_traces}, the goal's model family" if own_traces else "")
                + f"; {best_agent}: {_one_line(best_why, 240)}"
            )
            quotas.append(Quota(
                m.dataset_id, c, amount, split, config,
                "last" if c in AGENTIC_CATEGORIES else None, bool(own_traces), reason, m.license, traffic_of,
            ))
    label = name or f"proposed-{run_id or time.strftime('%Y%m%d-%H%M%S')}"
    return Proposal(label, goal, target_samples, shares, quotas, run_id, notes)


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def render_recipe(proposal: Proposal) -> str:
    """Return the proposal as recipe YAML, with each share's and quota's reason as comments."""
    q = json.dumps  # JSON strings are valid YAML scalars and escape everything safely
    lines = [
        f"# Proposed by `curator scout`{' run ' + proposal.run_id if proposal.run_id else ''}.",
        f"# Goal: {_one_line(proposal.goal, 200)}",
        f"# Target {proposal.target_samples:,} samples; quotas add up to {proposal.total():,}.",
        "# Review it, then: curator build-mix --recipe THIS_FILE --out DIR",
        "# Category shares:",
    ]
    lines[-1:-1] = [f"# Note: {_one_line(note, 300)}" for note in proposal.notes]
    for c, (share, why) in proposal.shares.items():
        lines.append(f"#   {c}: {share:.1%} ({why})")
    lines += [
        f"name: {q(proposal.name)}",
        f"description: {q('proposed from scout candidates for: ' + _one_line(proposal.goal, 200))}",
        "seed: 0",
        "sources:",
    ]
    current = None
    for quota in proposal.quotas:
        if quota.category != current:
            current = quota.category
            share, why = proposal.shares[current]
            lines.append(f"  # {current}: {share:.1%} of the mix ({why})")
        lines.append(f"  # {quota.reason}")
        lines.append(f"  - dataset: {q(quota.dataset_id)}")
        if quota.config:
            lines.append(f"    config: {q(quota.config)}")
        lines.append(f"    split: {q(quota.split)}")
        lines.append("    format: auto")
        lines.append(f"    samples: {quota.samples}")
        lines.append(f"    category: {q(quota.category)}")
        if quota.traffic:
            lines.append(f"    traffic: {quota.traffic}")
        if quota.turns:
            lines.append(f"    turns: {quota.turns}")
        if quota.keep_responses:
            lines.append("    keep_responses: true")
        if quota.license:
            lines.append(f"    license: {q(quota.license)}")
    lines.append("dedup: {exact: true, near: 0.85}")
    return "\n".join(lines) + "\n"


def write_proposal(proposal: Proposal, out: str | Path | None = None, recipes_dir: str | Path = "recipes") -> Path:
    """Write the proposal's recipe (validated by the recipe model) to `out` or recipes/NAME.yaml; return the path."""
    from curator.mix.recipe import recipe_from_dict

    text = render_recipe(proposal)
    path = Path(out) if out is not None else Path(recipes_dir) / f"{proposal.name}.yaml"
    recipe_from_dict(yaml.safe_load(text), str(path))  # a proposal the mix builder would refuse is a bug here
    write_text(path, text)
    return path
