"""A source's survey: one pass over every row before sampling, where the sample depends on all of them.

Two things need it: a traffic source (each row's category from the traffic classifier, and the
held-out conversations chosen), and `build-mix --match` (each row's hashed features, from which
the source's own feature distribution and the rows' importance weights follow; curator/mix/match.py).
The pass examines every row once; what it keeps per row is a category code, a held-out flag and,
under --match, the row's feature buckets (2 bytes each).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from curator.rows.formats.conversation import Conversation, as_messages
from curator.mix.match import FeatureStore, TrafficModel, match_texts, walk_keys
from curator.mix.recipe import SourceSpec
from curator.mix.sample import row_key
from curator.rows.formats.tap import request_part

UNUSABLE = -1
MAX_REASONS = 20  # distinct reasons a source's report keeps; the rest are counted under "other"
_BATCH = 512


@dataclass(frozen=True)
class Examined:
    """A row after normalising: its prompt (None when dropped), why dropped, its own id and category."""

    prompt: Conversation | None
    drop: str | None = None  # "malformed" | "filtered" | "heldout" | "surveyed" (counted by the survey)
    reason: str | None = None
    source_id: str | None = None
    category: str | None = None


def classify_prompt(prompt: Conversation, messages: list[dict[str, Any]] | None = None, text: str | None = None) -> str:
    """Return the traffic classifier's category for a prompt (`messages`: its `as_messages`, and `text`
    its user text, where the caller has them already)."""
    from curator.traffic.classify import classify  # the rules load only where traffic is read

    return classify(messages if messages is not None else as_messages(prompt), prompt.tools, text).category


def conversation_hash(seed: int, prompt: Conversation) -> int:
    """Return the seeded 64-bit hash of a request's conversation: its system prompt and first user turn,
    which every later request of the same conversation repeats."""
    system = next((c for r, c in prompt if r == "system"), "")
    first = next((c for r, c in prompt if r == "user"), "")
    text = " ".join(system.split()) + "\x00" + " ".join(first.split())
    digest = hashlib.blake2b(f"{seed}\x00heldout\x00{text}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass
class Survey:
    """What the pass learned about each row of a source."""

    names: list[str]  # categories, indexed by `codes`
    codes: np.ndarray  # int16 per row: category index, UNUSABLE for malformed or filtered rows
    excluded: np.ndarray  # bool per row: held out for evaluation, never in the mix
    heldout_conversations: int = 0
    features: FeatureStore | None = field(default=None, repr=False)
    # the UNUSABLE rows by (drop, reason): "malformed" or "filtered" (a tap record that is no whole exchange)
    unusable: Counter[tuple[str, str]] = field(default_factory=Counter, repr=False)

    @property
    def read(self) -> int:
        return int(self.codes.size)

    def counts(self) -> dict[str, int]:
        """Return the usable, not held-out rows per category."""
        usable = self.codes[(self.codes != UNUSABLE) & ~self.excluded]
        return {name: int(n) for name, n in zip(self.names, np.bincount(usable, minlength=len(self.names))) if n}

    def category(self, index: int) -> str | None:
        code = int(self.codes[index])
        return None if code == UNUSABLE else self.names[code]


def survey(
    rows: Iterator[object],
    examine: Callable[..., Examined],
    spec: SourceSpec,
    seed: int,
    buckets: int | None,
    on_read: Callable[[int], None] | None = None,
) -> Survey:
    """Examine every row: categories (classified for traffic), held-out conversations, features (when `buckets`)."""
    names: dict[str, int] = {}
    codes: list[int] = []
    convs: list[int] = []
    store = FeatureStore(buckets) if buckets is not None else None
    unusable: Counter[tuple[str, str]] = Counter()
    pending: tuple[list[int], list[str]] = ([], [])  # rows waiting for the feature store, and their user texts
    for index, row in enumerate(rows):
        if on_read is not None and index % 1000 == 999:
            on_read(index + 1)
        ex = examine(index, row, light=True)
        if ex.prompt is None:
            codes.append(UNUSABLE)
            convs.append(0)
            key = (ex.drop or "malformed", ex.reason or "malformed")
            # distinct reasons capped as a source report caps them (a broken line's reason names its line)
            unusable[key if key in unusable or len(unusable) < MAX_REASONS else (key[0], "other")] += 1
            continue
        # A traffic row is converted, and its user text taken, once for the classifier and the features;
        # a tapped row is classified on its request, as `curator profile` reads the same log.
        asked = request_part(ex.prompt) if spec.is_tap else ex.prompt
        messages = as_messages(asked) if spec.is_traffic or store is not None else None
        text = match_texts([messages])[0] if store is not None else None  # type: ignore[list-item]
        cat = classify_prompt(asked, messages, text) if spec.is_traffic else spec.category
        codes.append(names.setdefault(cat, len(names)))
        convs.append(conversation_hash(seed, ex.prompt) if spec.heldout is not None else 0)
        if store is not None:
            pending[0].append(index)
            pending[1].append(text)  # type: ignore[arg-type]
            if len(pending[0]) >= _BATCH:
                store.add(pending[0], pending[1])
                pending = ([], [])
    if store is not None:
        store.add(pending[0], pending[1])
    if on_read is not None:
        on_read(len(codes))
    code_array = np.asarray(codes, dtype=np.int16)
    excluded, n_conv = _heldout(code_array, np.asarray(convs, dtype=np.uint64), spec.heldout)
    return Survey(list(names), code_array, excluded, n_conv, features=store, unusable=unusable)


def _heldout(codes: np.ndarray, convs: np.ndarray, heldout: int | float | None) -> tuple[np.ndarray, int]:
    """Return (held-out mask, held-out conversations): a seeded fraction or count of the distinct conversations."""
    usable = codes != UNUSABLE
    if heldout is None or not usable.any():
        return np.zeros(codes.size, dtype=bool), 0
    distinct = np.unique(convs[usable])  # sorted: the conversations in seeded-hash order
    if isinstance(heldout, float):
        chosen = distinct[distinct < np.uint64(min(heldout * 2.0**64, 2.0**64 - 1))]
    else:
        chosen = distinct[:heldout]
    return usable & np.isin(convs, chosen), int(chosen.size)


def importance_keys(found: Survey, model: TrafficModel, seed: int, name: str) -> np.ndarray:
    """Return each row's walk key under --match (Gumbel top-k on log importance weights; inf for unusable rows)."""
    keys = np.full(found.read, np.inf)
    store = found.features
    if store is None or not store.rows:
        return keys
    rows = np.asarray(store.rows, dtype=np.int64)
    log_w = store.log_weights(found.codes[rows].astype(np.int64), model, found.names)
    hashes = np.fromiter((row_key(seed, name, int(i)) for i in rows), dtype=np.uint64, count=rows.size)
    keys[rows] = walk_keys(log_w, hashes)
    keys[found.excluded] = np.inf
    return keys
