"""How many samples of each category reach a goal acceptance, and what they cost, from drafts
trained on nested subsets of one pool.

The law. Acceptance length with a chain of K drafted tokens lies in [1, K + 1]. Published scaling
(EAGLE-3; Scylla, 2025) grows roughly log-linearly with data over the sizes measured, so two laws
are fitted per category, both straight lines in log(samples) after a transform of acceptance:

    log-linear:  AL = a + b ln n                      (the published shape; unbounded, so it
                                                       overshoots K + 1 far enough out)
    saturating:  logit((AL - 1) / K) = a + b ln n     (the same straight line in the middle,
                                                       bending toward K + 1: a draft never accepts
                                                       more than it drafts)

Each is an ordinary least-squares line, so its parameter covariance is the textbook one; the law
kept is the one with the smaller residual in acceptance units (both are printed). The samples for
a goal g solve the line for ln n; the band draws the line's parameters from their Student-t
distribution (degrees of freedom: points - 2) and reports the 10th and 90th percentiles of n.
With fewer than three distinct sizes, or a slope not clearly above zero (t < 2), the forecast
says so and extrapolates nothing.

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
MIN_T = 2.0  # slope / its standard error: under this the curve is flat within its noise
MAX_FOLD = 100.0  # past this many times the largest run, a line through the runs gives no number
BAND = (10, 90)  # percentiles of the samples-needed band
DRAWS = 4000


@dataclass
class Point:
    """One draft's figure on one category: its training samples there and the acceptance measured."""

    samples: int
    acceptance: float
    se: float = 0.0  # standard error of the acceptance (0: unknown; the residuals alone set the band)


@dataclass
class Fit:
    """One law's least-squares line in (ln n, transformed acceptance)."""

    law: str
    steps: int  # K: acceptance is at most K + 1
    a: float
    b: float
    cov: list[list[float]]  # covariance of (a, b)
    dof: int
    rmse: float  # residual in acceptance units (comparable between laws)

    def predict(self, n: float) -> float:
        """Return the acceptance the line gives at `n` samples."""
        return float(_untransform(self.law, self.a + self.b * math.log(n), self.steps))

    @property
    def slope_t(self) -> float:
        se = math.sqrt(max(self.cov[1][1], 0.0))
        return math.inf if se == 0 else self.b / se

    def solve(self, goal: float) -> float | None:
        """Return the samples at which the line reaches `goal` (None: never, it does not rise or the law's ceiling)."""
        y = _transform(self.law, goal, self.steps)
        if y is None or self.b <= 0:
            return None
        return math.exp(min((y - self.a) / self.b, 700.0))

    def draws(self, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Return DRAWS lines (a, b) drawn from the fit's Student-t distribution (degrees of freedom:
        points - 2), which widens with few points."""
        rng = np.random.default_rng(seed)
        z = rng.multivariate_normal([0.0, 0.0], np.asarray(self.cov), size=DRAWS, method="eigh")
        scale = np.sqrt(self.dof / rng.chisquare(self.dof, size=DRAWS)) if self.dof > 0 else np.ones(DRAWS)
        return self.a + z[:, 0] * scale, self.b + z[:, 1] * scale

    def band(self, goal: float, seed: int = 0) -> tuple[float, float]:
        """Return the (low, high) percentiles of the samples for `goal` over drawn lines (inf: unbounded)."""
        y = _transform(self.law, goal, self.steps)
        if y is None:
            return math.inf, math.inf
        a, b = self.draws(seed)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            n = np.where(b > 0, np.exp(np.minimum((y - a) / np.where(b > 0, b, 1.0), 700.0)), np.inf)
            # between two unbounded draws numpy interpolates inf - inf (nan, with a RuntimeWarning): unbounded
            lo, hi = np.percentile(n, BAND)
        return (math.inf if math.isnan(lo) else float(lo)), (math.inf if math.isnan(hi) else float(hi))

    def predict_draws(self, n: float, seed: int = 0) -> np.ndarray:
        """Return the acceptance at `n` samples under each drawn line."""
        a, b = self.draws(seed)
        return np.asarray(_untransform(self.law, a + b * math.log(n), self.steps))


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


def fit_law(points: Sequence[Point], law: str, steps: int) -> Fit | None:
    """Return the least-squares line of `law` through `points` (None: a point the law cannot take)."""
    xs, ys, ses = [], [], []
    for p in points:
        y = _transform(law, p.acceptance, steps)
        if y is None or p.samples <= 0:
            return None
        xs.append(math.log(p.samples))
        ys.append(y)
        # a standard error carried into the transformed axis by the transform's slope there
        d = 1.0 if law == "log-linear" else steps / ((p.acceptance - 1.0) * (steps + 1.0 - p.acceptance))
        ses.append(p.se * d)
    x, y = np.asarray(xs), np.asarray(ys)
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    dof = len(x) - 2
    noise = float(resid @ resid) / dof if dof > 0 else 0.0
    # measurement noise sets a floor: three points on a line by chance must not make the band vanish
    noise = max(noise, float(np.mean(np.square(ses))))
    cov = noise * np.linalg.inv(design.T @ design)
    fit = Fit(law, steps, float(coef[0]), float(coef[1]), cov.tolist(), dof, 0.0)
    fit.rmse = math.sqrt(sum((fit.predict(p.samples) - p.acceptance) ** 2 for p in points) / len(points))
    return fit


@dataclass
class CategoryForecast:
    """The samples one category needs for the goal, or why no number is given."""

    category: str
    points: list[Point]
    fits: dict[str, Fit]
    law: str | None  # the law kept (smaller residual)
    verdict: str  # "forecast" | "reached" | "too few runs" | "flat" | "unreachable" | "beyond the data"
    reason: str
    needed: float | None = None
    band: tuple[float, float] | None = None

    @property
    def have(self) -> int:
        return max((p.samples for p in self.points), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"category": self.category, "points": [asdict(p) for p in self.points],
                "fits": {k: asdict(f) | {"slope_t": _finite(f.slope_t)} for k, f in self.fits.items()},
                "law": self.law, "verdict": self.verdict, "reason": self.reason, "have": self.have,
                "needed": _finite(self.needed), "band": [_finite(v) for v in self.band] if self.band else None}


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def best_fit(points: Sequence[Point], steps: int) -> tuple[dict[str, Fit], Fit | None]:
    """Return every law's fit through `points` (two sizes at least) and the one with the smaller residual."""
    sizes = len({p.samples for p in points})
    fits = {law: f for law in LAWS if sizes >= 2 and (f := fit_law(points, law, steps)) is not None}
    return fits, (min(fits.values(), key=lambda f: f.rmse) if fits else None)


def forecast_category(category: str, points: Sequence[Point], goal: float, steps: int, seed: int = 0) -> CategoryForecast:
    """Return the forecast for one category: both laws fitted, the better kept, solved for `goal`."""
    pts = sorted(points, key=lambda p: p.samples)
    sizes = len({p.samples for p in pts})
    fits, best = best_fit(pts, steps)
    out = CategoryForecast(category, list(pts), fits, best.law if best else None, "forecast", "")
    if goal >= steps + 1:
        out.verdict, out.reason = "unreachable", f"a chain of {steps} drafted tokens accepts at most {steps + 1}"
        return out
    if pts and max(p.acceptance for p in pts) >= goal:
        reached = min(p.samples for p in pts if p.acceptance >= goal)
        out.verdict, out.reason, out.needed = "reached", f"already measured at {reached:,} samples", float(reached)
        return out
    if sizes < MIN_SIZES or best is None:
        out.verdict = "too few runs"
        out.reason = f"{sizes} distinct sample count(s); a forecast needs {MIN_SIZES} or more"
        return out
    if best.b <= 0 or best.slope_t < MIN_T:
        out.verdict = "flat"
        out.reason = (f"acceptance does not rise measurably with samples here (slope {best.b:+.3f} per e-fold, "
                      f"t = {best.slope_t:.1f} < {MIN_T:g}); more of this data is not the lever")
        return out
    needed = best.solve(goal)
    if needed is None:
        out.verdict, out.reason = "unreachable", f"the {best.law} law never reaches {goal:g}"
        return out
    far = needed / max(out.have, 1)
    if far > MAX_FOLD:
        out.verdict = "beyond the data"
        out.reason = (f"the {best.law} line reaches {goal:g} only near {needed:.1e} samples, {far:,.0f}x the largest "
                      f"run; no line through these runs says anything that far (limit {MAX_FOLD:g}x): more of this "
                      "data alone is not the way to the goal")
        return out
    out.needed, out.band = needed, best.band(goal, seed)
    out.reason = f"{best.law} law, {far:,.0f}x the largest run" + ("; far past the data, read as an order of magnitude"
                                                                   if far > 30 else "")
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
                usage = rec.get("usage") if isinstance(rec.get("usage"), dict) else {}
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


def break_even_from_report(path: str | Path) -> list[BreakEven]:
    """Return the break-even per concurrency of a `curator bench-serve --json` report: AL / speedup,
    the cost of one speculative cycle in plain decode steps (refused when it measured neither)."""
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the bench-serve report: {exc}") from None
    out = []
    for conc, row in sorted((report.get("concurrency") or {}).items(), key=lambda kv: int(kv[0])):
        al, speedup = row.get("acceptance_length"), row.get("speedup")
        if al and speedup:
            out.append(BreakEven(al / speedup, f"{path.name}, concurrency {conc}: acceptance {al:.2f} at {speedup:.2f}x"))
    if not out:
        raise ConfigError(f"{path}: the report has no concurrency with both an acceptance and a speedup "
                          "(run bench-serve with --baseline against an engine that reports acceptance)")
    return out


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


def run_point(run_dir: str | Path) -> tuple[dict[str, int], dict[str, float], int]:
    """Return (training samples per category, acceptance per category, chain length K) of a finished
    `curator train` run: a `curator eval --json` report saved as RUN/eval.json (measured) when
    present, else the simulated per-category acceptance of the run's final evaluation."""
    from training.feed.batches import training_ids
    from training.storage.index import read_index

    run = Path(run_dir)
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        ckpt = Path(summary["checkpoint"])
        meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{run}: not a finished training run ({exc})") from None
    cfg = meta.get("train_config", {})
    store = Path(meta["store"]["path"]) if "store" in meta else Path(cfg.get("data", ""))
    entries, _ = read_index(store)  # in index order, as the trainer reads the store's ids
    ids, _ = training_ids(list(entries), separate_eval=bool(cfg.get("eval_data")),
                          eval_fraction=cfg.get("eval_fraction", 0.05), eval_max_samples=cfg.get("eval_max_samples"),
                          max_train_samples=cfg.get("max_train_samples"))
    counts = _counts(entries, ids)
    if (run / "eval.json").exists():
        report = json.loads((run / "eval.json").read_text(encoding="utf-8"))
        acc = {c: v["acceptance_length"] for c, v in report.get("categories", {}).items() if v.get("acceptance_length")}
        return counts, acc, int(report.get("steps") or meta.get("ttt_steps") or cfg.get("ttt_steps"))
    ev = summary.get("eval") or {}
    acc = dict(ev.get("sim_categories") or {})
    if not acc:
        raise ConfigError(f"{run}: its final evaluation has no per-category acceptance (train with eval_data or "
                          "eval_fraction > 0, or save `curator eval --json` as eval.json in the run)")
    return counts, acc, int(ev.get("sim_steps") or meta.get("ttt_steps") or cfg.get("ttt_steps"))


def points_by_category(runs: Sequence[tuple[Mapping[str, int], Mapping[str, float]]]) -> dict[str, list[Point]]:
    """Return each category's (samples, acceptance) points over runs (a category a run did not train on is left out)."""
    out: dict[str, list[Point]] = {}
    for counts, acc in runs:
        for cat, value in acc.items():
            if counts.get(cat):
                out.setdefault(cat, []).append(Point(int(counts[cat]), float(value)))
    return out


@dataclass
class Forecast:
    """The whole answer: per category, samples for the goal, their cost; and the break-even."""

    goal: float
    steps: int
    categories: list[CategoryForecast]
    costs: dict[str, Cost | None] = field(default_factory=dict)
    cost_bands: dict[str, tuple[Cost | None, Cost | None]] = field(default_factory=dict)
    generation: GenerationCost | None = None
    bytes_per_token: int | None = None
    break_even: list[BreakEven] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def cost(c: Cost | None) -> dict[str, Any] | None:
            return {k: _finite(v) for k, v in asdict(c).items()} if c else None

        return {
            "goal": self.goal, "steps": self.steps, "categories": [c.to_json() for c in self.categories],
            "costs": {k: cost(v) for k, v in self.costs.items()},
            "cost_bands": {k: [cost(lo), cost(hi)] for k, (lo, hi) in self.cost_bands.items()},
            "generation": asdict(self.generation) if self.generation else None,
            "bytes_per_token": self.bytes_per_token,
            "break_even": [asdict(b) for b in self.break_even],
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
) -> Forecast:
    """Return the forecast for `goal` per category, with the cost of what each needs when the
    generation figures are given."""
    if not points:
        raise ConfigError("no run gave a per-category acceptance to fit")
    cats = [forecast_category(c, pts, goal, steps, seed) for c, pts in sorted(points.items())]
    fc = Forecast(goal, steps, cats, generation=generation, bytes_per_token=bytes_per_token, break_even=list(break_even))
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
    """One draft trained on a nested subset: its fraction, run directory and figures."""

    fraction: float
    run_dir: str
    counts: dict[str, int]
    acceptance: dict[str, float]
    steps: int


def train_nested(
    store: str | Path,
    target: str | Path,
    out: str | Path,
    fractions: Sequence[float],
    base: Mapping[str, Any],
    *,
    eval_store: str | Path | None = None,
    seed: int = 0,
    on_run: Any = None,
    on_metrics: Any = None,
) -> list[NestedRun]:
    """Train one draft per fraction on nested subsets of `store` (same steps, same settings `base`,
    a TrainConfig dict) and return each one's per-category simulated acceptance on the held-out
    samples: `eval_store`, or a hashed 5% of `store` set apart once for every subset.

    `on_metrics(fraction)` returns the trainer's metrics callback for that subset's run (a progress bar)."""
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
        result = train(cfg, on_metrics=on_metrics(frac) if on_metrics is not None else None)
        ev = result.eval or {}
        acc = dict(ev.get("sim_categories") or {})
        if not acc:
            raise ConfigError(f"run {cfg.out}: its evaluation gave no per-category acceptance")
        run = NestedRun(frac, cfg.out, _counts(entries, chosen), acc,
                        int(ev.get("sim_steps") or cfg.ttt_steps))
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs
