"""Hashed word n-gram features: what a traffic profile stores and `build-mix --match` compares.

The features are counts of word unigrams and bigrams hashed into a fixed number of buckets
(the feature space of DSIR, Xie et al. 2023). A bucket count says nothing recoverable about a
single request, so a profile can hold the traffic's feature distribution without holding text.
The hash is fixed (no process-seeded `hash()`): a profile written today must match a mix
built tomorrow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from curator.rows.shingles import mix64, normalise_text, word_hashes

BUCKETS = 1 << 14
FEATURE_METHOD = "hashed-word-1-2-grams"
_BIGRAM_MULT = np.uint64(0x9E3779B97F4A7C15)
_MAX_CHARS = 20_000  # a row's features come from its first 20K characters: cost stays linear and bounded


def feature_rows(texts: Sequence[str], buckets: int = BUCKETS) -> tuple[np.ndarray, np.ndarray]:
    """Return (doc index, bucket) per feature occurrence of `texts`, as two int64 arrays.

    Every text contributes one entry per word and one per adjacent word pair; an empty text
    contributes none. Computed for the whole batch at once (per-row numpy calls cost more
    than the hashing).
    """
    norms = [normalise_text(t[:_MAX_CHARS]) for t in texts]
    keep = [i for i, t in enumerate(norms) if t]
    if not keep:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    kept = [norms[i] for i in keep]
    counts = np.fromiter((t.count(" ") + 1 for t in kept), dtype=np.int64, count=len(kept))
    with np.errstate(over="ignore"):
        words = word_hashes(" ".join(kept))
        doc = np.repeat(np.asarray(keep, dtype=np.int64), counts)
        # a bigram joins word i and i+1 of the same document
        same = np.concatenate((doc[1:] == doc[:-1], [False]))
        nxt = np.concatenate((words[1:], np.zeros(1, dtype=np.uint64)))
        bigrams = mix64(words * _BIGRAM_MULT + nxt)[same]
    hashes = np.concatenate((words, bigrams))
    docs = np.concatenate((doc, doc[same]))
    return docs, (hashes % np.uint64(buckets)).astype(np.int64)


def distribution(texts: Sequence[str], buckets: int = BUCKETS) -> np.ndarray:
    """Return the summed feature counts (float64 [buckets]) of `texts`."""
    _, cells = feature_rows(texts, buckets)
    return np.bincount(cells, minlength=buckets).astype(np.float64)
