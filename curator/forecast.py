"""How many samples of each category reach a goal acceptance, and what they cost, from drafts
trained on nested subsets of one pool.

The law. Acceptance length with a chain of K drafted tokens lies in [1, K + 1]. Published scaling
(EAGLE-3; Scylla, 2025) grows roughly log-linearly with data over the sizes measured. Two shapes
are fitted per category, both straight lines in the log of the data the draft effectively saw:

    log-linear:  AL = a + b ln D                      (the published shape; unbounded, so it
                                                       overshoots K + 1 far enough out)
    saturating:  logit((AL - 1) / K) = a + b ln D     (the same straight line in the middle,
                                                       bending toward K + 1: a draft never accepts
                                                       more than it drafts)

The data axis sees the training budget. A draft trained E epochs on n samples saw each sample E
times, and a repeated sample is worth less than a new one. Muennighoff et al. (2023, "Scaling
Data-Constrained Language Models") fit that as an effective data size

    D = U (1 + R* (1 - exp(-R / R*))),   U = n min(E, 1) samples seen,  R = max(E - 1, 0) repeats

R* sets how fast repeats lose value: R* -> 0 is samples alone (the old law here), R* -> inf is
sequences seen alone (only the steps count). Their fit gave R* = 15.4; a draft on a few thousand
samples is not an LLM on billions of tokens, so R* is fitted here, on a grid, with their value as a
log-normal prior (one sigma: a factor 3), one R* for every category of a forecast (it is a property
of the training, not of the category). Runs that record no budget fall back to samples alone.

Each (shape, R*) is an ordinary least-squares line, so its parameter covariance is the textbook
one. They are combined, not picked: each gets the weight its residuals give it (the marginal
likelihood of a line with unknown noise, RSS^-(m-2)/2, times the prior of its R*), and the band is
drawn from the mixture, so it holds the fit's curvature (which shape, how much a repeat is worth)
as well as the scatter about each line. An acceptance band at a draft size also holds the noise
of one more draft (its figure is one noisy measurement, as the fitted points are); a samples band
is where the curve crosses the goal. Lines are drawn from their Student-t distribution (degrees
of freedom: points - 2) and the 10th and 90th percentiles reported. With fewer than three
distinct sizes, or a slope not clearly above zero (t < 2), the forecast says so and extrapolates
nothing.

The cost: target tokens per sample (prompt + answer, per category) and answer tokens from a
`curator generate` output, GPU-hours at that run's measured output tokens/s, disk at the planned
bytes per token of the target's hidden-state store (training/capture/plan.py). Break-even: one
speculative cycle (K draft steps plus one verify forward) costs `c` plain decode steps and yields
AL tokens, so speculation pays only when AL > c; `curator bench-serve`'s report gives
c = AL / speedup per concurrency.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from curator.errors import ConfigError

LAWS = ("log-linear", "saturating")
MIN_SIZES = 3  # distinct sample counts a category needs before a line through them says anything
# A category trained on a handful of samples is judged on as few held-out ones: an acceptance measured
# there is noise, not the goal reached. Under this many training samples no run declares "reached".
MIN_REACHED_SAMPLES = 100
MIN_T = 2.0  # slope / its standard error: under this the curve is flat within its noise
MAX_FOLD = 100.0  # past this many times the largest run, a line through the runs gives no number
BAND = (10, 90)  # percentiles of the samples-needed band
DRAWS = 4000
R_STAR = 15.4  # Muennighoff et al. 2023: the fitted decay constant of repeated data's value (R_D*)
R_STAR_SPREAD = 3.0  # the prior's one sigma, as a factor: a draft's data is not an LLM's
R_GRID = tuple(float(r) for r in np.geomspace(0.5, 500.0, 31))  # R* values weighed against each other
MAX_LN = 700.0  # exp() of more overflows a float: a sample count past e^700 is "unbounded"


class BadPointError(ConfigError):
    """An acceptance that cannot be one (not a number, not finite, outside [1, K + 1])."""


def check_acceptance(value: Any, steps: int, where: str) -> float:
    """Return `value` as an acceptance length of a chain of `steps`, or raise BadPointError naming `where`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadPointError(f"{where}: acceptance {value!r} is not a number")
    v = float(value)
    if not math.isfinite(v) or not 1.0 <= v <= steps + 1:
        raise BadPointError(f"{where}: acceptance {value!r} is impossible: with a chain of {steps} drafted "
                            f"tokens it lies in [1, {steps + 1}]")
    return v


@dataclass
class Point:
    """One draft's figure on one category: its training samples there, the acceptance measured, and
    the epochs it trained (None: not recorded; such points are fitted on samples alone)."""

    samples: int
    acceptance: float
    se: float = 0.0  # standard error of the acceptance (0: unknown; the residuals alone set the band)
    epochs: float | None = None


@dataclass(frozen=True)
class Budget:
    """How the draft the forecast speaks of is trained: a number of epochs, or a number of sequences
    (max_steps x global batch) whatever its size. Neither: samples alone."""

    epochs: float | None = None
    sequences: float | None = None

    def epochs_at(self, n: Any) -> Any:
        """Return the epochs a draft of `n` samples trains under this budget (None: not known)."""
        if self.epochs is not None:
            return self.epochs
        if self.sequences is not None:
            return self.sequences / np.asarray(n, dtype=np.float64)
        return None

    def describe(self) -> str:
        if self.epochs is not None:
            return f"{self.epochs:g} epochs"
        if self.sequences is not None:
            return f"{self.sequences:,.0f} sequences"
        return "samples alone"


def effective_samples(n: Any, epochs: Any, r_star: float | None) -> Any:
    """Return Muennighoff et al.'s effective data of `n` samples trained `epochs` epochs: the samples
    seen once plus their repeats, each further repeat worth less (`r_star` None or epochs None: n)."""
    n = np.asarray(n, dtype=np.float64)
    if r_star is None or epochs is None:
        return n
    e = np.asarray(epochs, dtype=np.float64)
    seen = n * np.minimum(e, 1.0)
    return seen * (1.0 + r_star * -np.expm1(-np.maximum(e - 1.0, 0.0) / r_star))


@dataclass
class Fit:
    """One law's least-squares line in (ln effective data, transformed acceptance)."""

    law: str
    steps: int  # K: acceptance is at most K + 1
    a: float
    b: float
    cov: list[list[float]]  # covariance of (a, b)
    dof: int
    rmse: float  # residual in acceptance units (comparable between laws)
    r_star: float | None = None  # the repeats' decay of the data axis (None: samples alone)
    noise: float = 0.0  # residual variance on the transformed axis: one more draft's scatter
    weight: float = 1.0  # its share of the mixture the band is drawn from

    def x(self, n: Any, epochs: Any = None) -> Any:
        """Return the line's abscissa, ln of the effective data of `n` samples at `epochs`."""
        return np.log(effective_samples(n, epochs, self.r_star))

    def predict(self, n: float, epochs: float | None = None) -> float:
        """Return the acceptance the line gives at `n` samples (trained `epochs` epochs)."""
        return float(_untransform(self.law, self.a + self.b * float(self.x(n, epochs)), self.steps))

    @property
    def slope_t(self) -> float:
        se = math.sqrt(max(self.cov[1][1], 0.0))
        return math.inf if se == 0 else self.b / se

    def solve(self, goal: float, budget: Budget | None = None) -> float | None:
        """Return the samples at which the line reaches `goal` under `budget` (None: never)."""
        n = self._samples_for(goal, np.asarray([self.a]), np.asarray([self.b]), budget or Budget())
        return None if n is None or not math.isfinite(n[0]) else float(n[0])

    def draws(self, seed: int = 0, size: int = DRAWS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return `size` lines (a, b) drawn from the fit's Student-t distribution (degrees of freedom:
        points - 2), which widens with few points, and the t scale of each draw."""
        rng = np.random.default_rng(seed)
        z = rng.multivariate_normal([0.0, 0.0], np.asarray(self.cov), size=size, method="eigh")
        scale = np.sqrt(self.dof / rng.chisquare(self.dof, size=size)) if self.dof > 0 else np.ones(size)
        return self.a + z[:, 0] * scale, self.b + z[:, 1] * scale, scale

    def band(self, goal: float, seed: int = 0, budget: Budget | None = None) -> tuple[float, float]:
        """Return the (low, high) percentiles of the samples for `goal` over drawn lines (inf: unbounded)."""
        a, b, _ = self.draws(seed)
        n = self._samples_for(goal, a, b, budget or Budget())
        return _percentile_band(np.full(DRAWS, np.inf) if n is None else n)

    def predict_draws(self, n: float, seed: int = 0, epochs: float | None = None, *, size: int = DRAWS,
                      noise: bool = False) -> np.ndarray:
        """Return the acceptance at `n` samples under each drawn line; `noise`: plus one more draft's
        scatter about its line (the figure of a draft still to be trained, not the line's mean)."""
        a, b, scale = self.draws(seed, size)
        y = a + b * float(self.x(n, epochs))
        if noise and self.noise > 0:
            y = y + np.random.default_rng(seed + 1).standard_normal(size) * math.sqrt(self.noise) * scale
        return np.asarray(_untransform(self.law, y, self.steps))

    def _samples_for(self, goal: float, a: np.ndarray, b: np.ndarray, budget: Budget) -> np.ndarray | None:
        """Return, per line (a, b), the samples at which it reaches `goal` (inf: never; None: the law never does)."""
        y = _transform(self.law, goal, self.steps)
        if y is None:
            return None
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            ln_d = np.where(b > 0, (y - a) / np.where(b > 0, b, 1.0), np.inf)  # ln of the effective data needed
        if self.r_star is None or (budget.epochs is None and budget.sequences is None):
            return np.where(ln_d < MAX_LN, np.exp(np.minimum(ln_d, MAX_LN)), np.inf)
        if budget.epochs is not None:
            # every size trains the same epochs: the effective data is n times a constant
            gain = float(effective_samples(1.0, budget.epochs, self.r_star))
            ln_n = ln_d - math.log(gain)
            return np.where(ln_n < MAX_LN, np.exp(np.minimum(ln_n, MAX_LN)), np.inf)
        # a fixed number of sequences: more samples means fewer repeats; the effective data grows with
        # n up to n = sequences (every sequence new) and stays there: past it the goal needs more steps
        seq = float(budget.sequences)  # type: ignore[arg-type]
        lo, hi = np.zeros_like(ln_d), np.full_like(ln_d, math.log(seq))
        for _ in range(60):  # bisection on ln n: the effective data is monotone in n here
            mid = (lo + hi) / 2
            n = np.exp(mid)
            below = np.log(effective_samples(n, seq / n, self.r_star)) < ln_d
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return np.where(ln_d <= math.log(seq), np.exp(hi), np.inf)


def _percentile_band(n: np.ndarray) -> tuple[float, float]:
    with np.errstate(invalid="ignore"):
        # between two unbounded draws numpy interpolates inf - inf (nan, with a RuntimeWarning): unbounded
        lo, hi = np.percentile(n, BAND)
    return (math.inf if math.isnan(lo) else float(lo)), (math.inf if math.isnan(hi) else float(hi))


def _transform(law: str, acceptance: float, steps: int) -> float | None:
    if law == "log-linear":
        return acceptance
    p = (acceptance - 1.0) / steps
    if not 0.0 < p < 1.0:
        return None  # at or past the floor 1 or the ceiling K + 1: the saturating law never gets there
    return math.log(p / (1.0 - p))


def _untransform(law: str, y: Any, steps: int) -> Any:
    """Return acceptance from the transformed axis (a float or an array of them)."""
    if law == "log-linear":
        return y
    with np.errstate(over="ignore"):
        return 1.0 + steps / (1.0 + np.exp(-np.asarray(y, dtype=np.float64)))


def fit_law(points: Sequence[Point], law: str, steps: int, r_star: float | None = None) -> Fit | None:
    """Return the least-squares line of `law` through `points` on the data axis of `r_star` (None:
    samples alone; None returned: a point the law cannot take, or sizes the axis cannot tell apart)."""
    xs: list[float] = []
    ys: list[float] = []
    ses: list[float] = []
    for p in points:
        transformed = _transform(law, p.acceptance, steps)
        if transformed is None or p.samples <= 0:
            return None
        xs.append(float(np.log(effective_samples(p.samples, p.epochs, r_star))))
        ys.append(transformed)
        # a standard error carried into the transformed axis by the transform's slope there
        d = 1.0 if law == "log-linear" else steps / ((p.acceptance - 1.0) * (steps + 1.0 - p.acceptance))
        ses.append(p.se * d)
    x, y = np.asarray(xs), np.asarray(ys)
    if np.ptp(x) < 1e-9:
        return None  # every point at one effective size (a fixed step budget, only repeats counting)
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    dof = len(x) - 2
    noise = float(resid @ resid) / dof if dof > 0 else 0.0
    # measurement noise sets a floor: three points on a line by chance must not make the band vanish
    noise = max(noise, float(np.mean(np.square(ses))))
    cov = noise * np.linalg.inv(design.T @ design)
    fit = Fit(law, steps, float(coef[0]), float(coef[1]), cov.tolist(), dof, 0.0, r_star, noise)
    fit.rmse = math.sqrt(sum((fit.predict(p.samples, p.epochs) - p.acceptance) ** 2 for p in points) / len(points))
    return fit


def _has_budget(points: Iterable[Point]) -> bool:
    """Return whether the points record their epochs (all of them; refused when only some do)."""
    known = [p.epochs is not None for p in points]
    if any(known) and not all(known):
        raise ConfigError("some runs record their training budget (epochs) and some do not: fit them apart")
    return bool(known) and all(known)


def _log_evidence(points: Sequence[Point], fit: Fit) -> float:
    """Return the log marginal likelihood of `fit`'s line up to a constant shared by every line
    through the same points: RSS^-(m-2)/2, the noise unknown (Jeffreys) and floored by the points'
    standard errors, in acceptance units so that the two laws compare."""
    m = len(points)
    floor = m * float(np.mean([p.se ** 2 for p in points])) if points else 0.0
    rss = max(fit.rmse ** 2 * m, floor, 1e-12)
    return -(m - 2) / 2 * math.log(rss)


def _r_prior(r: float) -> float:
    return -0.5 * ((math.log(r) - math.log(R_STAR)) / math.log(R_STAR_SPREAD)) ** 2


def r_star_weights(points: Mapping[str, Sequence[Point]], steps: int) -> dict[float | None, float]:
    """Return the weight of each R* of the grid given every category's points (one R* for all of
    them: how much a repeat is worth is the training's, not a category's); {None: 1} when the runs
    record no budget."""
    if not any(_has_budget(pts) for pts in points.values()):
        return {None: 1.0}
    logs = []
    for r in R_GRID:
        total = _r_prior(r)
        for pts in points.values():
            ev = [_log_evidence(pts, f) for law in LAWS if len({p.samples for p in pts}) >= 2
                  and (f := fit_law(pts, law, steps, r)) is not None]
            if ev:  # both laws are equally likely a priori: the category's evidence for r is their sum
                top = max(ev)
                total += top + math.log(sum(math.exp(e - top) for e in ev))
        logs.append(total)
    top = max(logs)
    w = [math.exp(v - top) for v in logs]
    return {r: v / sum(w) for r, v in zip(R_GRID, w)}


@dataclass
class Ensemble:
    """The lines a category's points support, each with its weight: the forecast is their mixture."""

    members: list[Fit]

    @property
    def law(self) -> str:
        """Return the law the points favour (the larger weight over every R*; with one R*: the smaller residual)."""
        return max(LAWS, key=lambda law: sum(f.weight for f in self.members if f.law == law))

    @property
    def best(self) -> Fit:
        """Return the most likely line of the favoured law."""
        return max((f for f in self.members if f.law == self.law), key=lambda f: f.weight)

    def predict(self, n: float, epochs: float | None = None) -> float:
        """Return the central acceptance at `n` samples (trained `epochs` epochs): the favoured law's
        lines averaged over R* (the band, from predict_draws, holds both laws)."""
        central = [f for f in self.members if f.law == self.law]
        return sum(f.weight * f.predict(n, epochs) for f in central) / sum(f.weight for f in central)

    def _split(self, size: int) -> list[tuple[Fit, int]]:
        """Return each member's number of draws out of `size` (largest remainders: they sum to `size`)."""
        raw = [f.weight * size for f in self.members]
        counts = [int(v) for v in raw]
        for i in sorted(range(len(raw)), key=lambda i: counts[i] - raw[i])[: size - sum(counts)]:
            counts[i] += 1
        return [(f, c) for f, c in zip(self.members, counts) if c > 0]

    def predict_draws(self, n: float, seed: int = 0, epochs: float | None = None, *, noise: bool = True) -> np.ndarray:
        """Return DRAWS acceptances at `n` samples drawn from the mixture (`noise`: of one more draft)."""
        return np.concatenate([f.predict_draws(n, seed + 7919 * i, epochs, size=c, noise=noise)
                               for i, (f, c) in enumerate(self._split(DRAWS))])

    def solve(self, goal: float, budget: Budget | None = None) -> float | None:
        """Return the samples at which the central curve (predict) reaches `goal` (None: not below e^700)."""
        budget = budget or Budget()

        def at(ln_n: float) -> float:
            n = math.exp(ln_n)
            return self.predict(n, budget.epochs_at(n))

        lo, hi = 0.0, MAX_LN
        if at(hi) < goal:
            return None
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if at(mid) < goal else (lo, mid)
        return math.exp(hi)

    def band(self, goal: float, seed: int = 0, budget: Budget | None = None) -> tuple[float, float]:
        """Return the (low, high) percentiles of the samples for `goal` over lines drawn from the mixture."""
        parts = []
        for i, (f, c) in enumerate(self._split(DRAWS)):
            a, b, _ = f.draws(seed + 7919 * i, c)
            n = f._samples_for(goal, a, b, budget or Budget())
            parts.append(np.full(c, np.inf) if n is None else n)
        return _percentile_band(np.concatenate(parts))


def fit_ensemble(points: Sequence[Point], steps: int, r_weights: Mapping[float | None, float] | None = None) -> Ensemble | None:
    """Return the mixture of every (law, R*) line through `points` (two sizes at least), each weighted
    by its evidence and its R*'s weight (`r_weights`: r_star_weights over every category; default:
    these points alone)."""
    if len({p.samples for p in points}) < 2:
        return None
    if r_weights is None:
        r_weights = r_star_weights({"": points}, steps)
    members, logs = [], []
    for r, wr in r_weights.items():
        if wr <= 0:
            continue
        fits = [f for law in LAWS if (f := fit_law(points, law, steps, r)) is not None]
        ev = [_log_evidence(points, f) for f in fits]
        for f, e in zip(fits, ev):
            members.append(f)
            logs.append(math.log(wr) + e - max(ev))  # within an R*, the laws split its weight by evidence
            logs[-1] -= math.log(sum(math.exp(v - max(ev)) for v in ev))
    if not members:
        return None
    top = max(logs)
    w = [math.exp(v - top) for v in logs]
    for f, v in zip(members, w):
        f.weight = v / sum(w)
    keep = [f for f in members if f.weight >= 1e-4]  # a member under 1 in 10,000 draws changes nothing
    total = sum(f.weight for f in keep)
    for f in keep:
        f.weight /= total
    return Ensemble(keep)


@dataclass
class CategoryForecast:
    """The samples one category needs for the goal, or why no number is given."""

    category: str
    points: list[Point]
    fits: dict[str, Fit]  # each law's line at the most likely R*
    law: str | None  # the law of the most likely line
    verdict: str  # "forecast" | "reached" | "too few samples" | "too few runs" | "no fit" | "flat" | "unreachable" | "beyond the data"
    reason: str
    needed: float | None = None
    band: tuple[float, float] | None = None
    ensemble: Ensemble | None = None

    @property
    def have(self) -> int:
        return max((p.samples for p in self.points), default=0)

    def to_json(self) -> dict[str, Any]:
        members = self.ensemble.members if self.ensemble else []
        return {"category": self.category, "points": [asdict(p) for p in self.points],
                "fits": {k: asdict(f) | {"slope_t": _finite(f.slope_t)} for k, f in self.fits.items()},
                "mixture": [{"law": f.law, "r_star": f.r_star, "weight": round(f.weight, 6)} for f in members],
                "law": self.law, "verdict": self.verdict, "reason": self.reason, "have": self.have,
                "needed": _finite(self.needed), "band": [_finite(v) for v in self.band] if self.band else None}


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def best_fit(points: Sequence[Point], steps: int, r_star: float | None = None) -> tuple[dict[str, Fit], Fit | None]:
    """Return every law's fit through `points` (two sizes at least) on the data axis of `r_star`, and
    the one with the smaller residual."""
    sizes = len({p.samples for p in points})
    fits = {law: f for law in LAWS if sizes >= 2 and (f := fit_law(points, law, steps, r_star)) is not None}
    return fits, (min(fits.values(), key=lambda f: f.rmse) if fits else None)


def forecast_category(category: str, points: Sequence[Point], goal: float, steps: int, seed: int = 0, *,
                      budget: Budget | None = None, r_weights: Mapping[float | None, float] | None = None) -> CategoryForecast:
    """Return the forecast for one category: the mixture of lines fitted, solved for `goal` at `budget`
    (default: the largest run's epochs when the runs record them, else samples alone)."""
    pts = sorted(points, key=lambda p: p.samples)
    sizes = len({p.samples for p in pts})
    ens = fit_ensemble(pts, steps, r_weights)
    best = ens.best if ens else None
    # each law's line at the most likely R* (printed with its residual); the band uses every member
    fits = {f.law: f for f in ens.members if f.r_star == best.r_star} | {best.law: best} if ens and best else {}
    out = CategoryForecast(category, list(pts), fits, best.law if best else None, "forecast", "", ensemble=ens)
    if budget is None:
        budget = Budget(epochs=pts[-1].epochs) if pts and pts[-1].epochs is not None else Budget()
    if goal >= steps + 1:
        out.verdict, out.reason = "unreachable", f"a chain of {steps} drafted tokens accepts at most {steps + 1}"
        return out
    reaching = [p for p in pts if p.acceptance >= goal]
    if reaching and max(p.samples for p in reaching) >= MIN_REACHED_SAMPLES:
        first = min((p for p in reaching if p.samples >= MIN_REACHED_SAMPLES), key=lambda p: p.samples)
        at = f" ({first.epochs:.3g} epochs)" if first.epochs is not None else ""
        out.verdict, out.reason, out.needed = "reached", f"already measured at {first.samples:,} samples{at}", float(first.samples)
        return out
    if reaching:
        top = max(reaching, key=lambda p: p.samples)
        out.verdict = "too few samples"
        out.reason = (f"acceptance {top.acceptance:.2f} measured with {top.samples:,} training samples; a goal counts as "
                      f"reached from {MIN_REACHED_SAMPLES:,} samples up, below that the figure is noise")
        return out
    if sizes < MIN_SIZES:
        out.verdict = "too few runs"
        out.reason = f"{sizes} distinct sample count(s); a forecast needs {MIN_SIZES} or more"
        return out
    if best is None or ens is None:
        out.verdict = "no fit"
        # every law takes any acceptance on its own axis: what defeats them all is one data size for every run
        out.reason = (f"no line fits these {sizes} runs: each saw the same effective data (a fixed step budget under "
                      "one epoch trains on as many samples whatever the subset's size); train them for whole epochs")
        return out
    if best.b <= 0 or best.slope_t < MIN_T:
        out.verdict = "flat"
        out.reason = (f"acceptance does not rise measurably with samples here (slope {best.b:+.3f} per e-fold, "
                      f"t = {best.slope_t:.1f} < {MIN_T:g}); more of this data is not the lever")
        return out
    needed = ens.solve(goal, budget)
    if needed is None and budget.sequences is None:
        out.verdict, out.reason = "unreachable", f"no line the runs support reaches {goal:g} at {budget.describe()}"
        return out
    if needed is None or (budget.sequences is not None and needed >= budget.sequences * (1 - 1e-9)):
        out.verdict = "unreachable"
        out.reason = (f"at {budget.describe()} even samples that are all new fall short of {goal:g}: "
                      "the goal needs more training steps, not only more data")
        return out
    far = needed / max(out.have, 1)
    if far > MAX_FOLD:
        out.verdict = "beyond the data"
        out.reason = (f"the {best.law} line reaches {goal:g} only near {needed:.1e} samples, {far:,.0f}x the largest "
                      f"run; no line through these runs says anything that far (limit {MAX_FOLD:g}x): more of this "
                      "data alone is not the way to the goal")
        return out
    out.needed, out.band = needed, ens.band(goal, seed, budget)
    out.reason = (f"{best.law} law, {far:,.0f}x the largest run, at {budget.describe()}"
                  + ("; far past the data, read as an order of magnitude" if far > 30 else ""))
    return out


# ---- cost ------------------------------------------------------------------------------------


@dataclass
class GenerationCost:
    """Per-sample target tokens by category and the throughput they were generated at."""

    tokens_per_sample: dict[str, float]  # prompt + answer tokens the target processes (and the store keeps)
    answer_tokens_per_sample: dict[str, float]  # tokens the target decodes
    output_tokens_per_s: float | None  # measured by `curator generate` (generation.json)
    gpus: int = 1  # GPUs behind that throughput
    source: str = ""


def generation_cost(gen_dir: str | Path, gpus: int = 1, tokens_per_s: float | None = None) -> GenerationCost:
    """Return the per-category token figures of a `curator generate` output and its measured throughput."""
    from training.records.chat_tokens import MalformedRecordError, iter_generation, tokenize_rows
    from training.capture.plan import record_length

    gen_dir = Path(gen_dir)
    meta_path = gen_dir / "generation.json"
    if not meta_path.exists():
        raise ConfigError(f"{gen_dir}: no generation.json; pass a `curator generate --out` directory")
    stats = json.loads(meta_path.read_text(encoding="utf-8")).get("stats", {})
    total: Counter[str] = Counter()
    answer: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for rec in iter_generation(gen_dir):
        cat = str(rec.get("category") or "all")
        try:
            if rec.get("mode") == "token":
                # record_length would tokenise the record a second time: count its rows here
                rows = tokenize_rows(rec)
                n = sum(len(r) for r in rows)
                done = sum(int(r.loss_mask.sum()) for r in rows)
            else:
                n, _ = record_length(rec, None)
                usage: dict[str, Any] = rec["usage"] if isinstance(rec.get("usage"), dict) else {}
                done = int(usage.get("completion_tokens") or 0) or n // 2
        except MalformedRecordError:
            continue
        total[cat] += n
        answer[cat] += done
        count[cat] += 1
    if not count:
        raise ConfigError(f"{gen_dir}: no readable generation records")
    tps = tokens_per_s if tokens_per_s is not None else (stats.get("output_tokens_per_s") or None)
    return GenerationCost({c: total[c] / count[c] for c in count}, {c: answer[c] / count[c] for c in count},
                          float(tps) if tps else None, gpus, str(gen_dir))


@dataclass
class Cost:
    """What `samples` of one category cost to generate and store."""

    samples: float
    target_tokens: float
    answer_tokens: float
    gpu_hours: float | None
    disk_bytes: float | None


def category_cost(samples: float, category: str, gen: GenerationCost, bytes_per_token: int | None) -> Cost | None:
    """Return the cost of `samples` of `category` (None: the generation output has no such category)."""
    per = gen.tokens_per_sample.get(category, gen.tokens_per_sample.get("all"))
    ans = gen.answer_tokens_per_sample.get(category, gen.answer_tokens_per_sample.get("all"))
    if per is None or ans is None or not math.isfinite(samples):
        return None
    tokens, answers = samples * per, samples * ans
    # decoding dominates generation: the throughput is answer tokens/s over the run's GPUs
    hours = answers / gen.output_tokens_per_s / 3600 * gen.gpus if gen.output_tokens_per_s else None
    return Cost(samples, tokens, answers, hours, tokens * bytes_per_token if bytes_per_token else None)


def store_bytes_per_token(target: str | Path, dtype: str = "bf16", n_aux: int = 3, has_final: bool = True) -> int:
    """Return the planned store bytes per token for the target's shape (training/capture/plan.py's bill)."""
    from training.errors import TrainingError
    from training.capture.plan import load_shape
    from training.storage.format import bytes_per_token

    try:
        shape = load_shape(target)
    except TrainingError as exc:
        raise ConfigError(str(exc)) from None
    return bytes_per_token(shape.hidden_size, n_aux, dtype, has_final)


# ---- break-even ------------------------------------------------------------------------------


@dataclass
class BreakEven:
    """The acceptance under which speculative decoding serves slower than plain decoding."""

    acceptance: float
    source: str


class BadServeReportError(ConfigError):
    """A bench-serve report's figure that cannot be one: an acceptance outside [1, K + 1] for the runs'
    chain of K, a speedup not finite and positive, or the two giving no finite break-even."""


def break_even_from_report(path: str | Path, steps: int | None = None) -> list[BreakEven]:
    """Return the break-even per concurrency of a `curator bench-serve --json` report: AL / speedup,
    the cost of one speculative cycle in plain decode steps (refused when it measured neither).

    Its figures are bounded as the runs' are (check_acceptance): an acceptance length lies in
    [1, steps + 1] for the runs' chain of `steps` drafted tokens ([1, inf) while that is not known yet).
    """
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such bench-serve report (write one with `curator bench-serve --json`)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: cannot read the bench-serve report: {exc}") from None
    rows = report.get("concurrency") if isinstance(report, dict) else None
    if not isinstance(rows, dict):
        raise ConfigError(f"{path}: not a `curator bench-serve --json` report (no \"concurrency\" object)")
    out = []
    for conc, row in sorted(rows.items(), key=lambda kv: _concurrency(path, kv[0])):
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: concurrency {conc} is {type(row).__name__}, not an object of figures")
        al = _positive_or_none(path, conc, "acceptance_length", row.get("acceptance_length"))
        if al is not None:
            _check_served_acceptance(path, conc, al, steps)
        speedup = _positive_or_none(path, conc, "speedup", row.get("speedup"))
        if al and speedup:
            if not math.isfinite(al / speedup):  # speedup 1e-308: a break-even past every float
                raise BadServeReportError(f"{path}: concurrency {conc}'s speedup is {speedup!r}: acceptance {al:g} over "
                                          "it is no finite break-even, not a measured speedup")
            out.append(BreakEven(al / speedup, f"{path.name}, concurrency {conc}: acceptance {al:.2f} at {speedup:.2f}x"))
    if not out:
        raise ConfigError(f"{path}: the report has no concurrency with both an acceptance and a speedup "
                          "(run bench-serve with --baseline against an engine that reports acceptance)")
    return out


def _check_served_acceptance(path: Path, conc: str, value: float, steps: int | None) -> None:
    """Refuse a served acceptance length no chain gives: under 1 (every cycle accepts the verified
    token), or over steps + 1 once the runs' chain length is known."""
    top = math.inf if steps is None else steps + 1
    if not 1.0 <= value <= top:
        chain = "" if steps is None else f" with the runs' chain of {steps} drafted tokens"
        bound = "at least 1" if steps is None else f"in [1, {steps + 1}]"
        raise BadServeReportError(f"{path}: concurrency {conc}'s acceptance_length is {value!r}, impossible{chain}: "
                                  f"an acceptance length lies {bound}")


def _concurrency(path: Path, key: str) -> int:
    try:
        n = int(key)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{path}: concurrency {key!r} is not a positive whole number")
    return n


def _positive_or_none(path: Path, conc: str, name: str, value: Any) -> float | None:
    """Return a report's figure: None (not measured) or a positive finite number (else a named error)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{path}: concurrency {conc}'s {name} is {value!r}, not a positive number")
    return float(value)


def check_verify_cost(value: float) -> float:
    """Return `--verify-cost` when it can be one: a cycle costs at least its one verify forward."""
    if not (math.isfinite(value) and value >= 1.0):
        raise ConfigError(f"--verify-cost is the cost of one speculative cycle in plain decode steps, at least 1 "
                          f"(the verify forward alone is one), not {value!r}")
    return value


def check_goal(value: float) -> float:
    """Return `--goal` when it can be an acceptance length: a number above 1 (the verified token alone)."""
    if not (math.isfinite(value) and value > 1.0):
        raise ConfigError(f"--goal is an acceptance length, a number above 1 (every cycle accepts the verified "
                          f"token), not {value!r}")
    return value


# ---- the points: from runs, or nested subsets trained here -------------------------------------


def nested_subsets(ids_by_category: Mapping[str, Sequence[str]], fractions: Sequence[float], seed: int = 0) -> dict[float, list[str]]:
    """Return, per fraction, the ids of a subset: each category's ids in one seeded order, cut at
    the fraction, so that every subset holds the smaller ones and the category shares stay the pool's."""
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ConfigError(f"fractions must lie in (0, 1], not {list(fractions)}")
    orders = {}
    for cat in sorted(ids_by_category):
        ids = sorted(ids_by_category[cat])
        random.Random(f"{seed}:{cat}").shuffle(ids)
        orders[cat] = ids
    return {f: sorted(sid for ids in orders.values() for sid in ids[: max(1, round(f * len(ids)))])
            for f in sorted(set(fractions))}


def subset_store(store_dir: str | Path, ids: Iterable[str], out: str | Path,
                 entries: Mapping[str, Any] | None = None) -> Path:
    """Write a read-only view of a hidden-state store holding only `ids` (its own meta and index,
    the shards linked, never copied); return its directory. `entries`: the store's index entries
    when the caller already read them."""
    from training.io.atomic import output_folder
    from training.storage.index import atomic_write_json, read_index

    src, out = Path(store_dir).resolve(), Path(out)
    if entries is None:
        entries, _ = read_index(src)
    missing = [sid for sid in ids if sid not in entries]
    if missing:
        raise ConfigError(f"{src}: {len(missing)} ids are not in the store (first: {missing[0]})")
    out = output_folder(out.parent, out.name)  # a planted link never sends index.json elsewhere
    atomic_write_json(out / "meta.json", json.loads((src / "meta.json").read_text(encoding="utf-8")))
    atomic_write_json(out / "index.json", {"samples": {sid: entries[sid] for sid in ids}, "skipped": {}})
    link = out / "shards"
    if link.is_symlink() or link.exists():
        if not (link.is_symlink() and link.resolve() == (src / "shards").resolve()):
            raise ConfigError(f"{link} exists and is not a link to {src / 'shards'}; pick an empty --out")
    else:
        link.symlink_to(src / "shards", target_is_directory=True)
    return out


def _counts(entries: Mapping[str, Mapping[str, Any]], ids: Iterable[str]) -> dict[str, int]:
    """Return how many of `ids` each category holds in a store's index entries."""
    return dict(Counter(str(entries[sid].get("category") or "all") for sid in ids))


@dataclass
class RunFigures:
    """What one finished `curator train` run gives the forecast."""

    counts: dict[str, int]  # training samples per category
    acceptance: dict[str, float]  # per category
    steps: int  # K, the chain length the acceptance is of
    train_steps: int  # optimizer steps it took
    batch_size: int  # sequences per step
    epochs: float  # train_steps x batch_size / its training samples: how often it saw each sample
    max_steps: int | None = None  # its config's fixed step budget (None: it trained a number of epochs)

    def point_source(self) -> tuple[dict[str, int], dict[str, float], float]:
        return self.counts, self.acceptance, self.epochs


def run_point(run_dir: str | Path) -> RunFigures:
    """Return the figures of a finished `curator train` run: a `curator eval --json` report saved as
    RUN/eval.json (measured) when present, else the simulated per-category acceptance of the run's
    final evaluation; with the budget it trained (steps, batch, epochs). A figure that cannot be an
    acceptance is a BadPointError naming the run."""
    from training.errors import TrainingError
    from training.feed.batches import training_ids
    from training.storage.index import read_index

    run = Path(run_dir)
    if not run.is_dir():
        raise BadPointError(f"{run}: no such run directory" if not run.exists() else f"{run}: not a run directory")
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        ckpt = Path(summary["checkpoint"])
        meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
        cfg = meta.get("train_config", {})
        store = Path(meta["store"]["path"]) if "store" in meta else Path(cfg.get("data", ""))
        entries, _ = read_index(store)  # in index order, as the trainer reads the store's ids
        ids, _ = training_ids(list(entries), separate_eval=bool(cfg.get("eval_data")),
                              eval_fraction=cfg.get("eval_fraction", 0.05), eval_max_samples=cfg.get("eval_max_samples"),
                              max_train_samples=cfg.get("max_train_samples"))
        report = json.loads((run / "eval.json").read_text(encoding="utf-8")) if (run / "eval.json").exists() else None
    except FileNotFoundError as exc:  # a run stopped early, or another folder: name the file, not the errno
        raise BadPointError(f"{run}: not a finished `curator train` run: no {exc.filename}") from None
    except (OSError, KeyError, TypeError, AttributeError, ValueError, RecursionError, TrainingError) as exc:
        raise BadPointError(f"{run}: not a finished training run ({type(exc).__name__}: {exc})") from None
    counts = _counts(entries, ids)
    if report is not None:
        cats = report.get("categories") if isinstance(report, dict) else None
        if not isinstance(cats, dict):
            raise BadPointError(f"{run}/eval.json: not a `curator eval --json` report (no \"categories\" object)")
        raw = {c: v.get("acceptance_length") if isinstance(v, dict) else v for c, v in cats.items()}
        k_raw = report.get("steps") or meta.get("ttt_steps") or cfg.get("ttt_steps")
        where = f"{run}/eval.json"
    else:
        ev = summary.get("eval") if isinstance(summary, dict) else None
        ev = ev if isinstance(ev, dict) else {}
        raw = ev.get("sim_categories") or {}
        if not isinstance(raw, dict) or not raw:
            raise BadPointError(f"{run}: its final evaluation has no per-category acceptance (train with eval_data or "
                                "eval_fraction > 0, or save `curator eval --json` as eval.json in the run)")
        k_raw = ev.get("sim_steps") or meta.get("ttt_steps") or cfg.get("ttt_steps")
        where = f"{run}/summary.json"
    if isinstance(k_raw, bool) or not isinstance(k_raw, int) or k_raw < 1:
        raise BadPointError(f"{where}: chain length {k_raw!r} is not a positive whole number")
    acc = {str(c): check_acceptance(v, k_raw, f"{where}, category {c}") for c, v in raw.items()}
    step, batch = summary.get("step"), cfg.get("global_batch_size")
    for name, v in (("step", step), ("global_batch_size", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadPointError(f"{run}: its {name} {v!r} is not a positive whole number")
    fixed = cfg.get("max_steps")
    return RunFigures(counts, acc, k_raw, step, batch, step * batch / max(len(ids), 1),
                      fixed if isinstance(fixed, int) and not isinstance(fixed, bool) and fixed > 0 else None)


def points_by_category(runs: Sequence[tuple[Any, ...]]) -> dict[str, list[Point]]:
    """Return each category's points over runs, each a (counts, acceptance) or (counts, acceptance,
    epochs) tuple (a category a run did not train on is left out)."""
    out: dict[str, list[Point]] = {}
    for run in runs:
        counts, acc = run[0], run[1]
        epochs = float(run[2]) if len(run) > 2 and run[2] is not None else None
        for cat, value in acc.items():
            if counts.get(cat):
                out.setdefault(cat, []).append(Point(int(counts[cat]), float(value), epochs=epochs))
    return out


def left_out_categories(runs: Sequence[tuple[Any, ...]]) -> dict[str, str]:
    """Return {category: why} for each category a run trained on or measured that no run gives a point
    (points_by_category needs both its training samples and its acceptance in the same run)."""
    kept = set(points_by_category(runs))
    trained: Counter[str] = Counter()
    measured: set[str] = set()
    for run in runs:
        trained.update({c: int(n) for c, n in run[0].items() if n})
        measured.update(run[1])
    out = {}
    for cat in sorted((set(trained) | measured) - kept):
        if cat not in measured:
            out[cat] = (f"trained on ({trained[cat]:,} samples over the runs) but no run measured its acceptance: "
                        "no held-out samples of it")
        elif not trained[cat]:
            out[cat] = "measured, but no run trained on it"
        else:
            out[cat] = "no run both trained on it and measured it"
    return out


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
            return {k: _finite(v) for k, v in asdict(c).items()} if c else None

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


@dataclass
class NestedRun:
    """One draft trained on a nested subset: its fraction, run directory, figures and budget."""

    fraction: float
    run_dir: str
    counts: dict[str, int]
    acceptance: dict[str, float]
    steps: int
    train_steps: int = 0  # optimizer steps it took
    batch_size: int = 0  # sequences per step
    epochs: float | None = None  # train_steps x batch_size / its training samples
    reused: bool = False  # finished before this call (--resume): read back, not trained again


def train_nested(
    store: str | Path,
    target: str | Path,
    out: str | Path,
    fractions: Sequence[float],
    base: Mapping[str, Any],
    *,
    eval_store: str | Path | None = None,
    seed: int = 0,
    resume: bool = False,
    on_run: Any = None,
    on_metrics: Any = None,
) -> list[NestedRun]:
    """Train one draft per fraction on nested subsets of `store` (same settings `base`, a TrainConfig
    dict: its epochs or max_steps are the budget the full mix will train with) and return each one's
    per-category simulated acceptance on the held-out samples (`eval_store`, or a hashed 5% of
    `store` set apart once for every subset) and the steps and epochs it trained.

    `resume`: a subset whose run finished is read back, one that was stopped (a kill, a full disk)
    continues from its last checkpoint, exactly (the trainer's --resume: it refuses a changed config
    or changed data). `on_metrics(fraction)` returns the trainer's metrics callback for that
    subset's run (a progress bar)."""
    from training.feed.batches import split_eval
    from training.io.atomic import output_folder
    from training.storage.index import read_index
    from training.train.config import TrainConfig
    from training.train.trainer import train

    out = Path(out)
    entries, _ = read_index(Path(store))
    ids = sorted(entries)
    if eval_store is None:
        ids, held = split_eval(ids, 0.05)
        if not held:
            raise ConfigError(f"{store}: too few samples to set 5% apart for evaluation; pass --eval-store")
        eval_store = subset_store(store, held, out / "heldout", entries)
    by_cat: dict[str, list[str]] = {}
    for sid in ids:
        by_cat.setdefault(str(entries[sid].get("category") or "all"), []).append(sid)
    runs = []
    for frac, chosen in nested_subsets(by_cat, fractions, seed).items():
        view = subset_store(store, chosen, out / f"subset-{frac:g}", entries)
        cfg = TrainConfig.from_dict({**base, "data": str(view), "eval_data": str(eval_store), "target": str(target),
                                     "out": str(output_folder(out, f"run-{frac:g}")), "max_train_samples": None,
                                     "seed": seed})
        finished = resume and (Path(cfg.out) / "summary.json").is_file()
        result = train(cfg, resume=resume, on_metrics=None if finished or on_metrics is None else on_metrics(frac))
        ev = result.eval or {}
        k = int(ev.get("sim_steps") or cfg.ttt_steps)
        raw = ev.get("sim_categories")
        if not isinstance(raw, dict) or not raw:
            raise ConfigError(f"run {cfg.out}: its evaluation gave no per-category acceptance")
        acc = {str(c): check_acceptance(v, k, f"run {cfg.out}, category {c}") for c, v in raw.items()}
        run = NestedRun(frac, cfg.out, _counts(entries, chosen), acc, k, result.step, cfg.global_batch_size,
                        result.step * cfg.global_batch_size / max(len(chosen), 1), finished)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs
