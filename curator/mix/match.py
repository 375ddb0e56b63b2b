"""`build-mix --match PROFILE.json`: a mix shaped like the target's traffic.

Two steps, both deterministic for the recipe's seed and linear in the rows:

1. **Category totals.** The recipe's total sample count is shared among the categories that both
   the recipe and the traffic have, in the traffic's proportions (largest remainders, so the
   targets sum to the total exactly); a recipe category counts for the traffic category it serves
   (its sources' `traffic:`, else its own name). Each category's target is shared among its
   sources in the proportions of their recipe quotas. A traffic category the recipe lacks is
   reported, never invented; a recipe category the traffic lacks gets nothing. A source that runs
   short gives its remainder to the other sources serving its traffic category
   (curator/mix/build.py).
2. **Rows like the traffic, inside a category.** Importance resampling over hashed word 1-2-gram
   features (DSIR, Xie et al. 2023, with the feature space of curator/traffic/features.py): with p
   the traffic's feature distribution for the category served (from the profile) and q the
   source's own (estimated from its rows of that category), a row's log importance weight is the
   mean of log p(f) - log q(f) over its features, times DSIR's chunk length (128), so that length
   does not decide. Sampling without replacement in proportion to the weights is the Gumbel top-k trick:
   each row's key is its log weight plus Gumbel noise drawn from a hash of (seed, source, row), and
   the walk takes rows in descending key. Both distributions are smoothed by adding one per bucket.

The text compared is the request's user text (`curator.traffic.classify.user_text`), the same text
`curator profile` hashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from curator.errors import ConfigError
from curator.traffic.features import FEATURE_METHOD, feature_rows
from curator.traffic.schema import Profile

CHUNK_FEATURES = 128  # DSIR's chunk length: a row counts as if it had this many features
SELECTION = "dsir-importance-gumbel-top-k"
UNIFORM = "uniform (the profile holds no features)"
_TWO64 = float(1 << 64)


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Return integers proportional to `weights` that sum to `total` (ties to the earlier weight)."""
    mass = float(sum(weights))
    if total <= 0 or mass <= 0:
        return [0] * len(weights)
    exact = [w * total / mass for w in weights]
    out = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def match_texts(conversations: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """Return the text of each conversation that matching compares with the traffic (its user text)."""
    from curator.traffic.classify import user_text

    return [user_text(list(messages)) for messages in conversations]


@dataclass
class MatchPlan:
    """Per-category targets of a matched mix and each source's share of them. A recipe category is
    matched under the traffic category it serves (`keys`; its own name when it serves none), so the
    targets, `kept` and the manifest's `match` entry are keyed by traffic category."""

    traffic_shares: dict[str, float]
    targets: dict[str, int]  # traffic category (or an unserving recipe category) -> rows
    quotas: dict[int, dict[str, int]]  # source index -> {recipe category: rows}
    not_in_recipe: dict[str, float]  # traffic categories no recipe category serves
    not_in_traffic: list[str]  # recipe categories the traffic does not have (target 0)
    method: str = SELECTION
    kept: dict[str, int] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # recipe category -> the key it is matched under

    def add_kept(self, category: str, rows: int) -> None:
        """Count `rows` kept of a recipe category under the traffic category it serves."""
        key = self.keys.get(category, category)
        self.kept[key] = self.kept.get(key, 0) + rows

    def to_dict(self, profile_path: str) -> dict[str, Any]:
        """Return the manifest's `match` entry: target vs achieved share per category and the method."""
        shared = sum(self.traffic_shares.get(c, 0.0) for c in self.targets)
        total_kept = sum(self.kept.values())
        categories = {}
        for cat, target in self.targets.items():
            kept = self.kept.get(cat, 0)
            categories[cat] = {
                "traffic_share": round(self.traffic_shares.get(cat, 0.0), 6),
                "target_share": round(self.traffic_shares.get(cat, 0.0) / shared, 6) if shared else 0.0,
                "target": target,
                "kept": kept,
                "achieved_share": round(kept / total_kept, 6) if total_kept else 0.0,
            }
        return {"profile": profile_path, "method": self.method, "features": FEATURE_METHOD,
                "categories": categories, "not_in_recipe": self.not_in_recipe, "not_in_traffic": self.not_in_traffic}


def match_key(category: str, serves: Mapping[str, str | None] | None) -> str:
    """Return the key a recipe category is matched under: the traffic category it serves (the recipe's
    `Recipe.served_categories()`), else its own name (unchanged for categories named as the traffic's)."""
    return (serves or {}).get(category) or category


def shared_categories(profile: Profile, recipe_categories: Iterable[str],
                      serves: Mapping[str, str | None] | None = None) -> list[str]:
    """Return the traffic categories (share > 0) that the recipe's categories serve, in the recipe's
    order; ConfigError listing both when there are none."""
    shares = profile.shares()
    recipe_cats = list(dict.fromkeys(recipe_categories))
    shared = [k for k in dict.fromkeys(match_key(c, serves) for c in recipe_cats) if k in shares]
    if not shared:
        raise ConfigError(
            f"the profile and the recipe share no category: the traffic has {', '.join(sorted(shares)) or 'none'}; "
            f"the recipe has {', '.join(sorted(recipe_cats))}; set the sources' `category:` to the traffic's names "
            "(or `traffic:` to the one each serves)"
        )
    return shared


def plan(profile: Profile, cells: Sequence[tuple[int, str, int]], total: int, method: str,
         serves: Mapping[str, str | None] | None = None) -> MatchPlan:
    """Return the matched quotas for recipe `cells` (source index, category, recipe rows) at `total` rows,
    each recipe category counting for the traffic category it serves (`serves`; without it, its own name).

    ConfigError, listing both, when the traffic and the recipe share no category.
    """
    shares = profile.shares()
    recipe_cats = list(dict.fromkeys(cat for _, cat, _ in cells))
    keys = {cat: match_key(cat, serves) for cat in recipe_cats}
    shared = shared_categories(profile, recipe_cats, serves)
    counts = largest_remainder([shares[c] for c in shared], total)
    targets = {keys[c]: 0 for c in recipe_cats}
    targets.update(dict(zip(shared, counts)))
    quotas: dict[int, dict[str, int]] = {}
    for key, target in targets.items():
        mine = [(i, cat, rows) for i, cat, rows in cells if keys[cat] == key]
        weights = [rows for _, _, rows in mine]
        if not sum(weights):  # sources whose recipe rows round to nothing still share their category's target
            weights = [1] * len(mine)
        for (i, cat, _), n in zip(mine, largest_remainder(weights, target)):
            quotas.setdefault(i, {})[cat] = n
    return MatchPlan(
        traffic_shares=dict(shares),
        targets=targets,
        quotas=quotas,
        not_in_recipe={c: s for c, s in sorted(shares.items()) if c not in targets},
        not_in_traffic=sorted(c for c in recipe_cats if keys[c] not in shares),
        method=method,
        keys=keys,
    )


class TrafficModel:
    """The traffic's smoothed log feature probabilities per category, from a profile."""

    def __init__(self, profile: Profile, serves: Mapping[str, str | None] | None = None) -> None:
        self.serves = dict(serves or {})  # a recipe category's rows are compared with its traffic category's
        features = profile.features
        if features is None:
            raise ConfigError("the profile holds no features")
        if features.method != FEATURE_METHOD:
            raise ConfigError(f"the profile's features are {features.method!r}, this curator matches on {FEATURE_METHOD!r}; "
                              "make the profile again with this curator (`curator profile`)")
        self.buckets = features.buckets
        self._counts: dict[str, np.ndarray] = {}
        for cat, sparse in features.per_category.items():
            dense = np.zeros(self.buckets, dtype=np.float64)
            idx = np.asarray(sparse.indices, dtype=np.int64)
            if idx.size and (idx.min() < 0 or idx.max() >= self.buckets):
                raise ConfigError(f"the profile's features for {cat!r} name buckets outside 0..{self.buckets - 1}")
            np.add.at(dense, idx, np.asarray(sparse.counts, dtype=np.float64))
            self._counts[cat] = dense
        self._all = sum(self._counts.values(), np.zeros(self.buckets, dtype=np.float64))

    def log_p(self, category: str) -> np.ndarray:
        """Return log p(bucket) for the traffic of the category a recipe category serves (all traffic
        where the profile lacks it)."""
        counts = self._counts.get(match_key(category, self.serves))
        if counts is None or not counts.sum():
            counts = self._all
        return _log_smoothed(counts)


def _log_smoothed(counts: np.ndarray) -> np.ndarray:
    return np.log(counts + 1.0) - np.log(counts.sum() + counts.size)


class FeatureStore:
    """Each surveyed row's hashed features, kept compactly until the source's own distribution is known."""

    def __init__(self, buckets: int) -> None:
        self.buckets = buckets
        self._dtype = np.uint16 if buckets <= 1 << 16 else np.uint32
        self._cells: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self.rows: list[int] = []  # row index of each stored row, in order

    def add(self, rows: Sequence[int], texts: Sequence[str]) -> None:
        """Store the features of `texts` (rows `rows` of the source)."""
        if not rows:
            return
        docs, cells = feature_rows(texts, self.buckets)
        order = np.argsort(docs, kind="stable")
        self._cells.append(cells[order].astype(self._dtype))
        self._lengths.append(np.bincount(docs, minlength=len(texts)).astype(np.int64))
        self.rows.extend(rows)

    def log_weights(self, categories: np.ndarray, model: TrafficModel, names: Sequence[str]) -> np.ndarray:
        """Return each stored row's log importance weight; `categories[k]` indexes `names` for stored row k."""
        if not self.rows:
            return np.zeros(0)
        cells = np.concatenate(self._cells).astype(np.int64)
        lengths = np.concatenate(self._lengths)
        row_of = np.repeat(np.arange(lengths.size), lengths)
        ratio = np.zeros((len(names), self.buckets), dtype=np.float64)
        for c, name in enumerate(names):
            mine = categories[row_of] == c
            q = np.bincount(cells[mine], minlength=self.buckets).astype(np.float64)
            ratio[c] = model.log_p(name) - _log_smoothed(q)
        per_feature = ratio[categories[row_of], cells]
        sums = np.bincount(row_of, weights=per_feature, minlength=lengths.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(lengths > 0, sums / np.maximum(lengths, 1), 0.0)
        return mean * CHUNK_FEATURES


def gumbel(hashes: np.ndarray) -> np.ndarray:
    """Return standard Gumbel noise from uniform 64-bit hashes (one per row)."""
    u = np.minimum((hashes.astype(np.float64) + 0.5) / _TWO64, 1.0 - 2.0**-53)  # never 0 or 1
    return -np.log(-np.log(u))


def walk_keys(log_w: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Return ascending walk keys for the Gumbel top-k order (the largest log weight + noise first)."""
    return -(log_w + gumbel(hashes))


def category_split(counts: Mapping[str, int], total: int) -> dict[str, int]:
    """Return `total` shared among categories in proportion to `counts` (a traffic source's own shares)."""
    names = sorted(counts)
    return dict(zip(names, largest_remainder([counts[n] for n in names], total)))
