"""Dedup across sources: exact (hash of normalised text) and near (MinHash LSH, datasketch).

The first row seen owns its text; later rows that match it are duplicates. Sources are
fed in priority order, so the earlier-listed source keeps the row.

Signatures use one-permutation hashing with rotation densification (Shrivastava & Li,
ICML 2014): each row's word 5-gram hashes are sorted once and split into 128 bins instead
of being hashed 128 times. Each bin of two signatures agrees with probability equal to
the Jaccard similarity, like classic MinHash, at a fraction of the cost; datasketch's
MinHashLSH picks the bands for the threshold and indexes them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from datasketch import LeanMinHash, MinHashLSH

NUM_PERM = 128  # bins; a power of two (the bin is the hash's top bits)
SHINGLE = 5
_BIN_SHIFT = np.uint64(64 - 7)
_VALUE_SHIFT = np.uint64(64 - 7 - 32)
_MASK32 = np.uint64(0xFFFFFFFF)
_rng = np.random.default_rng(20240611)  # fixed: signatures must not change between runs
_BYTE_MULT = _rng.integers(1, 2**63, 64, dtype=np.uint64) | np.uint64(1)
_SHINGLE_MULT = _rng.integers(1, 2**63, SHINGLE, dtype=np.uint64) | np.uint64(1)
_ROTATE = np.uint32(0x9E3779B1)


def normalise_text(text: str) -> str:
    """Return `text` lower-cased with runs of whitespace collapsed to one space."""
    return " ".join(text.lower().split())


def text_hash(norm: str) -> bytes:
    """Return a 16-byte digest of normalised text (the exact-dedup key)."""
    return hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest()


def _mix(h: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: spreads the sum-of-products hashes over all 64 bits.
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _word_hashes(joined: str) -> np.ndarray:
    """Return a 64-bit hash per space-separated word of normalised text, in order."""
    data = np.frombuffer(joined.encode("utf-8"), dtype=np.uint8)
    is_space = data == 32
    starts = np.concatenate(([0], np.flatnonzero(is_space) + 1))
    pos = np.arange(data.size) - starts[np.cumsum(is_space)]
    contrib = (data.astype(np.uint64) + np.uint64(1)) * _BYTE_MULT[pos & 63]
    contrib[is_space] = 0
    return _mix(np.add.reduceat(contrib, starts))


def signatures(norms: list[str]) -> np.ndarray:
    """Return the MinHash signatures (uint32 [len(norms), 128]) of non-empty normalised texts.

    Computed for a whole batch at once: per-row numpy calls would cost more than the hashing.
    """
    n = len(norms)
    if n == 0:
        return np.zeros((0, NUM_PERM), dtype=np.uint32)
    with np.errstate(over="ignore"):
        counts = np.fromiter((t.count(" ") + 1 for t in norms), dtype=np.int64, count=n)
        words = _word_hashes(" ".join(norms))
        doc = np.repeat(np.arange(n), counts)
        first_word = np.concatenate(([0], np.cumsum(counts)[:-1]))
        in_doc = np.arange(words.size) - first_word[doc]
        left = counts[doc] - in_doc  # words from here to the end of the document
        padded = np.concatenate((words, np.zeros(SHINGLE - 1, dtype=np.uint64)))
        # Word 5-grams; a document shorter than 5 words is one shingle of all its words.
        acc = np.zeros(words.size, dtype=np.uint64)
        for j in range(SHINGLE):
            acc += padded[j : j + words.size] * _SHINGLE_MULT[j] * (left > j).astype(np.uint64)
        starts = (left >= SHINGLE) | (in_doc == 0)
        hashes, doc = _mix(acc[starts]), doc[starts]
        # One-permutation hashing: the bin is a hash's top 7 bits, the value its next 32;
        # sorting by (document, hash) puts each (document, bin)'s minimum first.
        order = np.lexsort((hashes, doc))
        hashes, doc = hashes[order], doc[order]
        cell = doc * NUM_PERM + (hashes >> _BIN_SHIFT).astype(np.int64)
        first = np.concatenate(([True], cell[1:] != cell[:-1]))
        values = np.zeros((n, NUM_PERM), dtype=np.uint32)
        present = np.zeros((n, NUM_PERM), dtype=bool)
        values.reshape(-1)[cell[first]] = ((hashes[first] >> _VALUE_SHIFT) & _MASK32).astype(np.uint32)
        present.reshape(-1)[cell[first]] = True
        # Rotation densification: an empty bin borrows the next non-empty bin's value
        # (circularly), offset by the distance so borrowed values stay distinguishable.
        bins = np.arange(NUM_PERM)
        idx = np.where(present, bins, 4 * NUM_PERM)
        doubled = np.concatenate((idx, idx + NUM_PERM), axis=1)
        nxt = np.minimum.accumulate(doubled[:, ::-1], axis=1)[:, ::-1][:, :NUM_PERM]
        borrowed = np.take_along_axis(values, nxt % NUM_PERM, axis=1)
        return borrowed + (nxt - bins).astype(np.uint32) * _ROTATE


def signature(norm: str) -> np.ndarray:
    """Return the 128-value MinHash signature (uint32) of one non-empty normalised text."""
    return signatures([norm])[0]


@dataclass(frozen=True)
class Match:
    """A duplicate found: how (`exact` or `near`) and which source owns the original."""

    kind: str
    owner: int


@dataclass(frozen=True)
class Prepared:
    """A row's dedup keys: the exact digest and the MinHash signature (None where not used)."""

    digest: bytes | None
    signature: np.ndarray | None


class Deduper:
    """Remembers every kept row's text; tells whether a new row duplicates one of them."""

    def __init__(self, exact: bool = True, near: float | None = 0.85) -> None:
        self.exact = exact
        self.near = near
        self._hashes: dict[bytes, int] = {}
        self._sigs: list[np.ndarray] = []
        self._owners: list[int] = []
        self._lsh = MinHashLSH(threshold=near, num_perm=NUM_PERM) if near is not None else None

    def prepare(self, texts: list[str]) -> list[Prepared]:
        """Return the dedup keys of a batch of texts (signatures computed together, for speed)."""
        norms = [normalise_text(t) for t in texts]
        digests = [text_hash(n) if self.exact else None for n in norms]
        sigs: list[np.ndarray | None] = [None] * len(norms)
        if self._lsh is not None:
            nonempty = [i for i, n in enumerate(norms) if n]
            for i, sig in zip(nonempty, signatures([norms[i] for i in nonempty])):
                sigs[i] = sig
        return [Prepared(d, s) for d, s in zip(digests, sigs)]

    def check(self, item: Prepared, owner: int) -> Match | None:
        """Return the match if `item` duplicates a kept row; else remember it as `owner`'s and return None."""
        if item.digest is not None and item.digest in self._hashes:
            return Match("exact", self._hashes[item.digest])
        if self._lsh is not None and item.signature is not None:
            sig = item.signature
            lean = LeanMinHash(seed=1, hashvalues=sig, scheme="affine32")
            # LSH returns candidates; keep only those whose estimated Jaccard reaches the threshold.
            hits = [k for k in self._lsh.query(lean) if float(np.mean(self._sigs[k] == sig)) >= self.near]
            if hits:
                return Match("near", self._owners[min(hits)])
            key = len(self._sigs)
            self._sigs.append(sig)
            self._owners.append(owner)
            self._lsh.insert(key, lean, check_duplication=False)
        if item.digest is not None:
            self._hashes[item.digest] = owner
        return None
