"""The law: how acceptance grows with the data a draft saw, fitted per category, and the samples
that reach a goal acceptance.

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
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
                "fits": {k: asdict(f) | {"slope_t": finite_or_none(f.slope_t)} for k, f in self.fits.items()},
                "mixture": [{"law": f.law, "r_star": f.r_star, "weight": round(f.weight, 6)} for f in members],
                "law": self.law, "verdict": self.verdict, "reason": self.reason, "have": self.have,
                "needed": finite_or_none(self.needed), "band": [finite_or_none(v) for v in self.band] if self.band else None}


def finite_or_none(v: float | None) -> float | None:
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


def check_goal(value: float) -> float:
    """Return `--goal` when it can be an acceptance length: a number above 1 (the verified token alone)."""
    if not (math.isfinite(value) and value > 1.0):
        raise ConfigError(f"--goal is an acceptance length, a number above 1 (every cycle accepts the verified "
                          f"token), not {value!r}")
    return value
