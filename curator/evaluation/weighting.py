"""Judging a draft on the traffic it will serve: `curator eval --profile PROFILE.json`.

The eval reports acceptance per category of its prompts (or of the hidden-state store's samples,
for the simulated figure); the traffic-weighted total weights the traffic categories by the
profile's shares (training.eval.simulate.traffic_weighted does the arithmetic, on plain dicts, since
training/ never imports curator). A prompt category counts for the traffic category of the same
name (agentic, code, reasoning, chat), or for the one its scout brief serves (a mix proposed by
`curator scout` names brief categories: coding and debugging count for code, writing for chat).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from curator.errors import ConfigError
from curator.scout.briefs import load_briefs
from curator.scout.traffic_shares import served_by
from curator.traffic.schema import load_profile


@dataclass(frozen=True)
class EvalWeights:
    """What the eval weights by: the profile's shares, category names to traffic categories, the profile's name."""

    shares: dict[str, float]
    groups: dict[str, str]
    source: str


def brief_groups(agents_dir: str | Path | None = None) -> dict[str, str]:
    """Return {brief category: traffic category} for the categories that serve another one, by the scouts'
    rule (`curator.scout.traffic_shares.served_by`; none when there are no briefs)."""
    try:
        briefs = load_briefs(agents_dir)
    except ConfigError:
        return {}
    return {c: served for c in dict.fromkeys(b.category for b in briefs)
            if (served := served_by(c, briefs)) is not None and served != c}


def eval_weights(profile: str | Path, agents_dir: str | Path | None = None) -> EvalWeights:
    """Return the weights of the profile in `profile` (ConfigError when it is missing or invalid)."""
    loaded = load_profile(profile)
    # every category the profile names, those without requests too: their prompts weigh 0, not "unknown"
    shares = {name: entry.share for name, entry in loaded.categories.items()}
    return EvalWeights(shares=shares, groups=brief_groups(agents_dir), source=Path(profile).name)
