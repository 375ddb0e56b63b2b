"""The whole forecast: the samples each category needs for a goal, what they cost, and the break-even."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from curator.errors import ConfigError
from curator.forecast.cost import BreakEven, Cost, GenerationCost, category_cost
from curator.forecast.law import R_STAR, R_STAR_SPREAD, Budget, CategoryForecast, Point, finite_or_none, forecast_category, r_star_weights


@dataclass
class Forecast:
    """The whole answer: per category, samples for the goal, their cost; and the break-even."""

    goal: float
    steps: int
    categories: list[CategoryForecast]
    budget: Budget = field(default_factory=Budget)
    r_star: dict[float | None, float] = field(default_factory=dict)  # the weight of each R* the lines use
    costs: dict[str, Cost | None] = field(default_factory=dict)
    cost_bands: dict[str, tuple[Cost | None, Cost | None]] = field(default_factory=dict)
    generation: GenerationCost | None = None
    bytes_per_token: int | None = None
    break_even: list[BreakEven] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)  # category -> why no run gave it a point

    def to_json(self) -> dict[str, Any]:
        def cost(c: Cost | None) -> dict[str, Any] | None:
            return {k: finite_or_none(v) for k, v in asdict(c).items()} if c else None

        return {
            "goal": self.goal, "steps": self.steps, "budget": asdict(self.budget),
            "r_star": {"prior": {"median": R_STAR, "spread": R_STAR_SPREAD},
                       "weights": [[r, round(w, 6)] for r, w in self.r_star.items()]},
            "categories": [c.to_json() for c in self.categories],
            "costs": {k: cost(v) for k, v in self.costs.items()},
            "cost_bands": {k: [cost(lo), cost(hi)] for k, (lo, hi) in self.cost_bands.items()},
            "generation": asdict(self.generation) if self.generation else None,
            "bytes_per_token": self.bytes_per_token,
            "break_even": [asdict(b) for b in self.break_even],
            "left_out": dict(self.left_out),
        }


def make_forecast(
    points: Mapping[str, Sequence[Point]],
    goal: float,
    steps: int,
    *,
    generation: GenerationCost | None = None,
    bytes_per_token: int | None = None,
    break_even: Sequence[BreakEven] = (),
    seed: int = 0,
    budget: Budget | None = None,
) -> Forecast:
    """Return the forecast for `goal` per category at `budget` (default: the largest run's epochs when
    the runs record them, else samples alone), with the cost of what each needs when the generation
    figures are given."""
    if not points:
        raise ConfigError("no run gave a per-category acceptance to fit")
    weights = r_star_weights(points, steps)
    if budget is None:
        largest = max((p for pts in points.values() for p in pts), key=lambda p: p.samples)
        budget = Budget(epochs=largest.epochs) if largest.epochs is not None else Budget()
    cats = [forecast_category(c, pts, goal, steps, seed, budget=budget, r_weights=weights)
            for c, pts in sorted(points.items())]
    fc = Forecast(goal, steps, cats, budget, weights, generation=generation, bytes_per_token=bytes_per_token,
                  break_even=list(break_even))
    if generation is not None:
        for c in cats:
            if c.verdict == "forecast" and c.needed is not None:
                fc.costs[c.category] = category_cost(c.needed, c.category, generation, bytes_per_token)
                lo, hi = c.band or (math.nan, math.nan)
                fc.cost_bands[c.category] = (category_cost(lo, c.category, generation, bytes_per_token),
                                             category_cost(hi, c.category, generation, bytes_per_token))
    return fc
