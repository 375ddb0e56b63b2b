"""`curator profile`: read a traffic sample once and write its profile (curator.traffic.schema).

One pass over the requests, in batches: each is classified by the rules (curator.traffic.
classify), measured (prompt length, user turns, tools, language) and its user text hashed into
the per-category feature counts that `build-mix --match` compares against. The rows the rules
left unsure may then go to a model (`--llm`); their category is settled only after that, so
their features and examples wait for it. Memory holds one number or two per row, the batch
being processed, and the unsure rows waiting for the model (at most `llm_max`).

Nothing personal leaves: the profile holds counts, shares and percentiles, plus at most
EXAMPLES_PER_CATEGORY examples per category, scrubbed (curator.traffic.scrub) and cut short.
"""

from __future__ import annotations

import json
import random
import re
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from curator.errors import ConfigError
from curator.llm import LLMClient
from curator.rows.readers import BrokenRow
from curator.traffic.ask_llm import ask_categories
from curator.traffic.classify import classify, user_text
from curator.traffic.features import BUCKETS, FEATURE_METHOD, feature_rows
from curator.traffic.language import METHOD as LANGUAGE_METHOD
from curator.traffic.language import is_english
from curator.traffic.read import TrafficRow, iter_traffic
from curator.traffic.schema import CATEGORIES, Profile
from curator.traffic.scrub import scrub
from training.io.atomic import write_text

EXAMPLES_PER_CATEGORY = 3
EXAMPLE_CHARS = 240
CONTEXTS = {"2k": 2048, "8k": 8192, "32k": 32768}
CHARS_PER_TOKEN = 4  # the estimate used for the context shares when no tokenizer is given
DEFAULT_LLM_MAX = 1000
_BATCH = 1024
_MAX_REASONS = 20
_QUOTED = re.compile(r"'[^']*'")

Progress = Callable[[int], None]


@dataclass
class _Tally:
    """What the pass accumulates; one entry per row in the arrays, counts elsewhere."""

    rows: Counter[str] = field(default_factory=Counter)  # category -> rows
    rules: Counter[str] = field(default_factory=Counter)  # rule name -> rows
    malformed: Counter[str] = field(default_factory=Counter)
    lengths: array = field(default_factory=lambda: array("q"))
    turns: array = field(default_factory=lambda: array("q"))
    unsure: int = 0
    tools_declared: int = 0
    tool_calls: int = 0
    tool_use: int = 0
    non_english: int = 0
    features: np.ndarray = field(default_factory=lambda: np.zeros((len(CATEGORIES), BUCKETS)))
    examples: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CATEGORIES})
    seen: Counter[str] = field(default_factory=Counter)  # rows offered to each category's reservoir

    def malformed_row(self, broken: BrokenRow) -> None:
        # the reason without its location ("(file record N)") and without the values it quotes from the
        # record (a role, a call id): rows of one kind count together, and no data leaves through a reason
        reason = scrub(_QUOTED.sub("'…'", broken.reason.rsplit(" (", 1)[0]))
        key = reason if reason in self.malformed or len(self.malformed) < _MAX_REASONS else "other"
        self.malformed[key] += 1


def _prompt_text(row: TrafficRow) -> list[str]:
    """Return the pieces of a prompt the target reads as text: contents, tool-call arguments, tool schemas."""
    pieces = [m.get("content") or "" for m in row.messages]
    pieces += [c["function"]["arguments"] for m in row.messages for c in (m.get("tool_calls") or [])]
    if row.tools:
        pieces.append(json.dumps(row.tools, ensure_ascii=False))
    return pieces


class _Lengths:
    """Prompt lengths: target tokens with a tokenizer (message texts, no chat template), else characters."""

    def __init__(self, tokenizer: str | Path | None) -> None:
        self.counter = None
        if tokenizer is not None:
            if not Path(tokenizer).is_dir():  # a name would send transformers to the Hub
                raise ConfigError(f"--tokenizer {tokenizer}: not a folder (give the target's local model or tokenizer folder)")
            from curator.rows.tokens import TokenCounter  # loads transformers: only with --tokenizer

            self.counter = TokenCounter(tokenizer)
        self.unit = "tokens" if self.counter else "characters"

    def measure(self, pieces: list[str]) -> int:
        if self.counter is None:
            return sum(len(p) for p in pieces)
        return self.counter.count([("", p) for p in pieces if p])


def _add_features(tally: _Tally, texts: list[str], categories: list[int]) -> None:
    docs, cells = feature_rows(texts)
    if len(docs):
        cats = np.asarray(categories, dtype=np.int64)[docs]
        tally.features += np.bincount(cats * BUCKETS + cells, minlength=len(CATEGORIES) * BUCKETS).reshape(
            len(CATEGORIES), BUCKETS)


def _offer_example(tally: _Tally, category: str, text: str, rng: random.Random) -> None:
    """Keep a uniform sample of EXAMPLES_PER_CATEGORY texts per category (reservoir sampling)."""
    tally.seen[category] += 1
    kept = tally.examples[category]
    if len(kept) < EXAMPLES_PER_CATEGORY:
        kept.append(text)
    else:
        j = rng.randrange(tally.seen[category])
        if j < EXAMPLES_PER_CATEGORY:
            kept[j] = text


def _example(text: str) -> str:
    one_line = " ".join(scrub(text).split())
    return one_line if len(one_line) <= EXAMPLE_CHARS else one_line[: EXAMPLE_CHARS - 1] + "…"


def _percentiles(values: array) -> dict[str, float]:
    data = np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(1)
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return {"mean": round(float(data.mean()), 2), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(data.max())}


def _batches(rows: Iterable[TrafficRow | BrokenRow], size: int) -> Iterable[list[TrafficRow | BrokenRow]]:
    batch: list[TrafficRow | BrokenRow] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def build_profile(
    traffic: str | Path,
    *,
    tokenizer: str | Path | None = None,
    llm: LLMClient | None = None,
    llm_max: int = DEFAULT_LLM_MAX,
    llm_concurrency: int = 8,
    seed: int = 0,
    progress: Progress | None = None,
) -> Profile:
    """Return the profile of the traffic in `traffic` (a request log, a folder of them, or a mix).

    With `llm`, up to `llm_max` of the rows the rules left unsure are classified by the model
    (the rest keep the rules' category). ConfigError when no request in it can be read.
    """
    if llm is not None and llm_max < 1:
        raise ConfigError("--llm-max must be at least 1")
    lengths = _Lengths(tokenizer)
    tally = _Tally()
    rng = random.Random(seed)
    pending: list[tuple[str, str]] = []  # (rules' category, user text) of unsure rows waiting for the model
    read = 0
    for batch in _batches(iter_traffic(traffic), _BATCH):
        texts, cats = [], []
        for row in batch:
            if isinstance(row, BrokenRow):
                tally.malformed_row(row)
                continue
            text = user_text(row.messages)
            decision = classify(row.messages, row.tools, text)
            tally.rules[decision.rule] += 1
            pieces = _prompt_text(row)
            tally.lengths.append(lengths.measure(pieces))
            tally.turns.append(sum(1 for m in row.messages if m["role"] == "user"))
            declared = bool(row.tools)
            called = any(m.get("tool_calls") or m["role"] == "tool" for m in row.messages)
            tally.tools_declared += declared
            tally.tool_calls += called
            tally.tool_use += declared or called
            tally.non_english += not is_english(text)
            if not decision.sure:
                tally.unsure += 1
                if llm is not None and len(pending) < llm_max:
                    pending.append((decision.category, text))
                    continue
            tally.rows[decision.category] += 1
            texts.append(text)
            cats.append(CATEGORIES.index(decision.category))
            _offer_example(tally, decision.category, text, rng)
        _add_features(tally, texts, cats)
        read += len(batch)
        if progress is not None:
            progress(read)
    by_llm = _settle(tally, pending, llm, llm_concurrency, rng)
    return _profile(tally, lengths.unit, by_llm, len(pending), llm, traffic)


def _settle(tally: _Tally, pending: list[tuple[str, str]], llm: LLMClient | None, concurrency: int,
            rng: random.Random) -> int:
    """Give the waiting rows their category (the model's, else the rules'); return how many the model decided."""
    if llm is None:
        return 0
    answers = ask_categories(llm, [text for _, text in pending], concurrency)
    by_llm = 0
    for (rules_category, text), answer in zip(pending, answers):
        category = answer or rules_category
        by_llm += answer is not None
        tally.rows[category] += 1
        _offer_example(tally, category, text, rng)
    _add_features(tally, [t for _, t in pending], [CATEGORIES.index(a or r) for (r, _), a in zip(pending, answers)])
    return by_llm


def _profile(tally: _Tally, unit: str, by_llm: int, sent_to_llm: int, llm: LLMClient | None, traffic: str | Path) -> Profile:
    total = sum(tally.rows.values())
    if total == 0:
        reasons = ", ".join(f"{r} ({n:,})" for r, n in tally.malformed.most_common(3)) or "the input is empty"
        raise ConfigError(f"{traffic}: no readable request ({sum(tally.malformed.values()):,} malformed: {reasons}); "
                          "expected JSON Lines of chat requests ({messages, tools?, ...}), {\"body\": {...}} records, "
                          "a mix folder, or parquet/JSONL with a `messages` column")
    tokens = tally.lengths if unit == "tokens" else array("q", (c // CHARS_PER_TOKEN for c in tally.lengths))
    measured = np.frombuffer(tokens, dtype=np.int64)
    features = {
        "method": FEATURE_METHOD,
        "buckets": BUCKETS,
        "per_category": {
            cat: {"indices": np.flatnonzero(tally.features[i]).tolist(),
                  "counts": tally.features[i][tally.features[i] > 0].tolist()}
            for i, cat in enumerate(CATEGORIES)
        },
    }
    # validated as the JSON a reader loads is: the statistics beyond the schema's fields are its extras
    return Profile.model_validate(dict(
        categories={c: {"share": tally.rows[c] / total, "rows": tally.rows[c]} for c in CATEGORIES},
        features=features,
        rows=total,
        malformed=sum(tally.malformed.values()),
        malformed_reasons=dict(tally.malformed.most_common()),
        decided={"rules": total - by_llm, "llm": by_llm, "rules_unsure": tally.unsure,
                 "unsure_sent_to_llm": sent_to_llm},
        classifier={"rules": "curator.traffic.classify", "llm": getattr(llm, "model", None)},
        rules=dict(sorted(tally.rules.items())),
        length={"unit": unit, "measure": "all message texts, tool-call arguments and tool schemas; no chat template",
                **_percentiles(tally.lengths)},
        context={"unit": "tokens" if unit == "tokens" else f"estimated tokens (characters / {CHARS_PER_TOKEN})",
                 **{f"past_{name}": float((measured > limit).mean()) for name, limit in CONTEXTS.items()}},
        turns={"unit": "user turns per conversation", **_percentiles(tally.turns),
               "multi_turn": float((np.frombuffer(tally.turns, dtype=np.int64) > 1).mean())},
        tool_use={"rate": tally.tool_use / total, "declared": tally.tools_declared / total,
                  "calls_or_results": tally.tool_calls / total},
        non_english={"share": tally.non_english / total, "method": LANGUAGE_METHOD},
        examples={c: [_example(t) for t in tally.examples[c]] for c in CATEGORIES},
    ))


def write_profile(profile: Profile, out: str | Path) -> Path:
    """Write the profile as JSON (temporary name, then rename); return the path."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name such as {out / 'profile.json'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    data = profile.model_dump(mode="json")
    features = data.pop("features")
    # statistics indented for a reader, the feature counts (tens of thousands of numbers) on one line
    text = json.dumps(data, indent=1, ensure_ascii=False)[:-2] + ',\n "features": ' + json.dumps(features) + "\n}\n"
    write_text(out, text)
    return out
