"""Sharing a whole number (agents, samples) among weighted categories, each within its cap: the one
rule the proposal and the traffic-following scouts both use."""

from __future__ import annotations

from curator.mix.match import largest_remainder

DEFAULT_WEIGHT = 0.05  # a category no brief weighs (an agent filed under another's category)


def cap_sum(caps: list[int | None]) -> int | None:
    """Return the cap of a group of shares: the sum of theirs, or None (no cap) when any has none."""
    known = [c for c in caps if c is not None]
    return sum(known) if len(known) == len(caps) else None


def allocate(total: int, weights: list[float], caps: list[int | None]) -> list[int]:
    """Return integer shares of `total` proportional to `weights`, each within its cap (water-filling)."""
    n = len(weights)
    out = [0] * n
    cap_of = {i: cap for i, cap in enumerate(caps) if cap is not None}  # uncapped shares are absent
    open_ = [i for i in range(n) if weights[i] > 0 and cap_of.get(i, 1) > 0]
    remaining = total
    while remaining > 0 and open_:
        weight_sum = sum(weights[i] for i in open_)
        exact = {i: remaining * weights[i] / weight_sum for i in open_}
        capped = [i for i in open_ if i in cap_of and out[i] + exact[i] >= cap_of[i]]
        if capped:
            for i in capped:
                remaining -= cap_of[i] - out[i]
                out[i] = cap_of[i]
            open_ = [i for i in open_ if i not in capped]
            continue
        # no cap reached: the rest is shared by largest remainders, so the shares sum exactly to the total
        for i, share in zip(open_, largest_remainder([weights[i] for i in open_], remaining)):
            out[i] += share
        remaining = 0
    return out
