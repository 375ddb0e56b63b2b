"""The scouts following a traffic profile (`curator scout --profile PROFILE.json`).

Each brief serves one traffic category: its front matter's `traffic:` key, else its own
category when that is one of the profile's (agentic, code, reasoning, chat). The agents are
shared among the traffic categories by the traffic's shares, heaviest briefs first within a
category; the proposal's category weights become the traffic's shares, each traffic category's
share split among the brief categories that serve it by their brief weights. Categories the
traffic does not ask for get nothing, and a traffic category nobody serves is reported, not
invented.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from curator.errors import ConfigError
from curator.scout.allocation import DEFAULT_WEIGHT, allocate, cap_sum
from curator.scout.briefs import Brief
from curator.traffic.schema import CATEGORIES, load_profile, serves

def traffic_category(brief: Brief) -> str | None:
    """Return the traffic category a brief serves, or None when it names none."""
    if brief.traffic is not None:
        return brief.traffic
    return brief.category if brief.category in CATEGORIES else None


@dataclass(frozen=True)
class TrafficShares:
    """A traffic profile's category shares, as the scouts use them, and the profile's name for reasons."""

    source: str
    shares: dict[str, float]  # traffic category -> share of the requests (only categories with requests)

    @classmethod
    def load(cls, path: str | Path) -> TrafficShares:
        """Return the shares of the profile in `path` (ConfigError when it is missing or invalid)."""
        return cls(Path(path).name, load_profile(path).shares())

    def served_by(self, category: str, briefs: list[Brief]) -> str | None:
        """Return the traffic category that a brief category (a candidate's) serves (see `served_by`)."""
        return served_by(category, briefs)


def served_by(category: str, briefs: list[Brief]) -> str | None:
    """Return the traffic category that a brief category serves: the one its briefs name, else the
    category itself when it is a traffic category; None when it serves none (or its briefs disagree)."""
    return serves(category, (traffic_category(b) for b in briefs if b.category == category))


def served_map(briefs: list[Brief]) -> dict[str, str]:
    """Return {brief category: traffic category} for every brief category that serves one (`served_by`)."""
    return {c: served for c in dict.fromkeys(b.category for b in briefs)
            if (served := served_by(c, briefs)) is not None}


def take_for_traffic(briefs: list[Brief], limit: int | None, traffic: TrafficShares) -> tuple[list[Brief], dict[str, int], list[str]]:
    """Return (the briefs to run, agents per traffic category, notes): `limit` agents (all briefs when None)
    shared by the traffic's shares, each category capped at the briefs that serve it, heaviest briefs first."""
    limit = len(briefs) if limit is None else limit
    if limit < 1:
        raise ConfigError(f"--agents must be at least 1, got {limit}")
    groups: dict[str, list[Brief]] = defaultdict(list)
    for brief in briefs:  # heaviest first, as load_briefs orders them
        served = traffic_category(brief)
        if served is not None:
            groups[served].append(brief)
    cats = [c for c in CATEGORIES if traffic.shares.get(c, 0) > 0]
    counts = dict(zip(cats, allocate(limit, [traffic.shares[c] for c in cats], [len(groups[c]) for c in cats])))
    notes = [f"the traffic's {c} share ({traffic.shares[c]:.1%}) has no brief serving it (add `traffic: {c}` to one)"
             for c in cats if not groups[c]]
    chosen_ids = {b.id for c in cats for b in groups[c][: counts[c]]}
    if not chosen_ids:
        raise ConfigError(f"no brief serves a category of the traffic in {traffic.source} "
                          f"({', '.join(cats)}); set `traffic:` in the briefs' front matter")
    if len(chosen_ids) < limit:
        notes.append(f"{len(chosen_ids)} of {limit} agents: only that many briefs serve the traffic's categories")
    return [b for b in briefs if b.id in chosen_ids], counts, notes


def traffic_weights(categories: list[str], briefs: list[Brief], traffic: TrafficShares) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Return (weight, reason) per candidate category and notes: each traffic category's share split
    among the candidate categories serving it by brief weight; 0 for categories the traffic lacks."""
    brief_weight = {b.category: b.weight for b in briefs}
    by_traffic: dict[str, list[str]] = defaultdict(list)
    weights: dict[str, float] = {}
    reasons: dict[str, str] = {}
    for c in categories:
        served = traffic.served_by(c, briefs)
        if served is None or traffic.shares.get(served, 0) <= 0:
            weights[c] = 0.0
            reasons[c] = (f"traffic profile {traffic.source}: no {served} requests" if served else
                          f"serves no category of traffic profile {traffic.source}")
            continue
        by_traffic[served].append(c)
    for served, cats in by_traffic.items():
        share = traffic.shares[served]
        total = sum(brief_weight.get(c, DEFAULT_WEIGHT) for c in cats)
        for c in cats:
            part = brief_weight.get(c, DEFAULT_WEIGHT) / total if total > 0 else 1 / len(cats)
            weights[c] = share * part
            reasons[c] = (f"traffic profile {traffic.source}: {served} is {share:.1%} of requests"
                          + (f", {part:.0%} of it by brief weight" if len(cats) > 1 else ""))
    notes = [f"traffic profile {traffic.source}: {served} is {share:.1%} of requests but no dataset was found for it; "
             "the other categories share its samples"
             for served, share in traffic.shares.items() if share > 0 and served not in by_traffic]
    if not any(weights.values()):
        raise ConfigError(f"none of the categories found ({', '.join(categories)}) serves the traffic in {traffic.source} "
                          f"({', '.join(f'{c} {s:.0%}' for c, s in traffic.shares.items())}); scout its categories first")
    return weights, reasons, notes


def allocate_by_traffic(total: int, categories: list[str], weights: dict[str, float], caps: list[int | None],
                        briefs: list[Brief], traffic: TrafficShares) -> list[int]:
    """Return samples per candidate category (aligned with `categories`): `total` shared among the traffic
    categories by their weights first, then within each among its candidate categories, so that a
    category short of rows gives its remainder to the others serving the same traffic category."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(categories):
        if weights.get(c, 0) > 0:
            groups[traffic.served_by(c, briefs) or c].append(i)
    names = list(groups)
    group_caps = [cap_sum([caps[i] for i in groups[g]]) for g in names]
    per_group = allocate(total, [sum(weights[categories[i]] for i in groups[g]) for g in names], group_caps)
    out = [0] * len(categories)
    for g, n in zip(names, per_group):
        members = groups[g]
        for i, amount in zip(members, allocate(n, [weights[categories[i]] for i in members], [caps[i] for i in members])):
            out[i] = amount
    return out
