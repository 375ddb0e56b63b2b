"""Judging a draft on the traffic it will serve: `curator eval --profile PROFILE.json`.

The eval reports acceptance per category of its prompts (or of the hidden-state store's samples,
for the simulated figure); the traffic-weighted total weights the traffic categories by the
profile's shares (training.eval.simulate.traffic_weighted does the arithmetic, on plain dicts, since
training/ never imports curator). A prompt category counts for the traffic category the mix
recorded it serves (the manifest's `serves`, which build-mix writes from the recipe's `traffic:`:
a mix proposed by `curator scout` has coding and debugging serve code, writing chat). The map is
the mix's, never rebuilt from whatever briefs exist when the eval runs: those may have changed
since. A mix without one (built before it was recorded, or prompts from a file) counts each
category for the traffic category of the same name only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from curator.rows.schema import MANIFEST, is_mix, open_mix
from curator.traffic.schema import CATEGORIES, load_profile


@dataclass(frozen=True)
class EvalWeights:
    """What the eval weights by: the profile's shares, category names to traffic categories, the
    profile's name, and the manifest the map was read from (None: none recorded, same names only)."""

    shares: dict[str, float]
    groups: dict[str, str]
    source: str
    recorded: str | None = None


def recorded_serves(mix: str | Path | None) -> tuple[dict[str, str], str | None]:
    """Return ({category: traffic category} as build-mix recorded it in the mix's manifest, that
    manifest's path); ({}, None) when `mix` is no mix folder or its manifest records no map. A
    held-out split (MIX/.heldout) records its own."""
    if mix is None or not is_mix(mix):
        return {}, None
    serves = open_mix(mix, verify=False).manifest.get("serves")  # the prompts' reader checks the parts' bytes
    if not isinstance(serves, dict):
        return {}, None
    groups = {c: t for c, t in serves.items() if isinstance(c, str) and t in CATEGORIES}
    return groups, str(Path(mix) / MANIFEST)


def eval_weights(profile: str | Path, mix: str | Path | None = None) -> EvalWeights:
    """Return the weights of the profile in `profile` (ConfigError when it is missing or invalid), its
    categories mapped as the mix in `mix` (the eval's prompts folder) recorded them."""
    loaded = load_profile(profile)
    # every category the profile names, those without requests too: their prompts weigh 0, not "unknown"
    shares = {name: entry.share for name, entry in loaded.categories.items()}
    groups, recorded = recorded_serves(mix)
    return EvalWeights(shares=shares, groups=groups, source=Path(profile).name, recorded=recorded)
