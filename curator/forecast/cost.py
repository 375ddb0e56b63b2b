"""What a forecast's samples cost, and the acceptance under which speculation does not pay.

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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curator.errors import ConfigError


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
