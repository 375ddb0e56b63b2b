"""Dedup across sources: exact (hash of normalised text) and near (MinHash LSH, datasketch).

The first row seen owns its text; later rows that match it are duplicates. Sources are
fed in priority order, so the earlier-listed source keeps the row.

Signatures use one-permutation hashing with rotation densification (Shrivastava & Li,
ICML 2014): each row's word 5-gram hashes are sorted once and split into 128 bins instead
of being hashed 128 times. Each bin of two signatures agrees with probability equal to
the Jaccard similarity, like classic MinHash, at a fraction of the cost.

Near matches are found in two steps. datasketch's MinHashLSH proposes candidates with bands
chosen for recall (`lsh_bands`: a pair exactly at the threshold becomes a candidate with
probability >= 0.999, where datasketch's default weighting gives 0.46 at 0.85); each candidate
is then confirmed by the exact Jaccard of the two rows' 5-gram sets (32-bit hashes of them are
kept for every kept row), so the candidates' extra false positives cost time, never rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from datasketch import LeanMinHash, MinHashLSH

from curator.rows.shingles import mix64, normalise_text, word_hashes

NUM_PERM = 128  # bins; a power of two (the bin is the hash's top bits)
SHINGLE = 5
_BIN_SHIFT = np.uint64(64 - 7)
_VALUE_SHIFT = np.uint64(64 - 7 - 32)
_MASK32 = np.uint64(0xFFFFFFFF)
_rng = np.random.default_rng(20240611)  # fixed: signatures must not change between runs
_rng.integers(1, 2**63, 64, dtype=np.uint64)  # the word hashes' multipliers (rows/shingles.py) were drawn first
_SHINGLE_MULT = _rng.integers(1, 2**63, SHINGLE, dtype=np.uint64) | np.uint64(1)
_ROTATE = np.uint32(0x9E3779B1)
_SET_SHIFT = np.uint64(32)
LSH_RECALL = 0.999  # chance that a pair exactly at the threshold shares a band


def text_hash(norm: str) -> bytes:
    """Return a 16-byte digest of normalised text (the exact-dedup key)."""
    # surrogatepass: a lone surrogate hashes like any other text instead of raising.
    return hashlib.blake2b(norm.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def lsh_bands(threshold: float, num_perm: int = NUM_PERM, recall: float = LSH_RECALL) -> tuple[int, int]:
    """Return (bands, rows per band): the longest bands with which a pair at `threshold` is a candidate
    with probability >= `recall` (longer bands: fewer candidates far below the threshold)."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if 1.0 - (1.0 - threshold**rows) ** bands >= recall:
            return bands, rows
    return num_perm, 1


def candidate_probability(jaccard: float, bands: int, rows: int) -> float:
    """Return the chance that a pair of that Jaccard similarity shares at least one band."""
    return 1.0 - (1.0 - jaccard**rows) ** bands


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Return the Jaccard similarity of two sorted, unique shingle-hash arrays."""
    if a.size == 0 or b.size == 0:
        return 1.0 if a.size == b.size else 0.0
    common = np.intersect1d(a, b, assume_unique=True).size
    return common / (a.size + b.size - common)


def signatures(norms: list[str]) -> np.ndarray:
    """Return the MinHash signatures (uint32 [len(norms), 128]) of non-empty normalised texts.

    Computed for a whole batch at once: per-row numpy calls would cost more than the hashing.
    """
    return sketches(norms)[0]


def sketches(norms: list[str]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Return (MinHash signatures uint32 [n, 128], each text's sorted unique 32-bit 5-gram hashes)."""
    n = len(norms)
    if n == 0:
        return np.zeros((0, NUM_PERM), dtype=np.uint32), []
    with np.errstate(over="ignore"):
        counts = np.fromiter((t.count(" ") + 1 for t in norms), dtype=np.int64, count=n)
        words = word_hashes(" ".join(norms))
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
        hashes, doc = mix64(acc[starts]), doc[starts]
        # One-permutation hashing: the bin is a hash's top 7 bits, the value its next 32;
        # sorting by (document, hash) puts each (document, bin)'s minimum first.
        order = np.lexsort((hashes, doc))
        hashes, doc = hashes[order], doc[order]
        # The 5-gram sets for the exact check: top 32 bits of each hash, sorted within each document.
        top = (hashes >> _SET_SHIFT).astype(np.uint32)
        fresh = np.concatenate(([True], (top[1:] != top[:-1]) | (doc[1:] != doc[:-1])))
        sets = np.split(top[fresh], np.flatnonzero(np.diff(doc[fresh])) + 1)
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
        return borrowed + (nxt - bins).astype(np.uint32) * _ROTATE, sets


def signature(norm: str) -> np.ndarray:
    """Return the 128-value MinHash signature (uint32) of one non-empty normalised text."""
    return signatures([norm])[0]


@dataclass(frozen=True)
class Match:
    """A duplicate found: how (`exact` or `near`), which source owns the original and, for a near
    match, which remembered row it is (0 = the first row kept with a near-dedup signature)."""

    kind: str
    owner: int
    row: int | None = None


@dataclass(frozen=True)
class Prepared:
    """A row's dedup keys: the exact digest, the MinHash signature and the 5-gram set (None where not used)."""

    digest: bytes | None
    signature: np.ndarray | None
    shingles: np.ndarray | None = None


class Deduper:
    """Remembers every kept row's text; tells whether a new row duplicates one of them."""

    def __init__(self, exact: bool = True, near: float | None = 0.85) -> None:
        self.exact = exact
        self.near = near
        self._hashes: dict[bytes, int] = {}
        self._sets: list[np.ndarray] = []
        self._owners: list[int] = []
        self.bands = lsh_bands(near) if near is not None else None
        self._lsh = MinHashLSH(num_perm=NUM_PERM, params=self.bands) if self.bands is not None else None

    def prepare(self, texts: list[str]) -> list[Prepared]:
        """Return the dedup keys of a batch of texts (signatures computed together, for speed)."""
        norms = [normalise_text(t) for t in texts]
        digests = [text_hash(n) if self.exact else None for n in norms]
        sigs: list[np.ndarray | None] = [None] * len(norms)
        sets: list[np.ndarray | None] = [None] * len(norms)
        if self._lsh is not None:
            nonempty = [i for i, n in enumerate(norms) if n]
            batch_sigs, batch_sets = sketches([norms[i] for i in nonempty])
            for i, sig, shingles in zip(nonempty, batch_sigs, batch_sets):
                sigs[i], sets[i] = sig, shingles
        return [Prepared(d, s, h) for d, s, h in zip(digests, sigs, sets)]

    def adopt(self, item: Prepared) -> Prepared:
        """Return `item` (prepared by another Deduper) with only the keys this one uses, as `prepare` would."""
        keep_sketch = self._lsh is not None
        return Prepared(item.digest if self.exact else None, item.signature if keep_sketch else None,
                        item.shingles if keep_sketch else None)

    def check(self, item: Prepared, owner: int) -> Match | None:
        """Return the match if `item` duplicates a kept row; else remember it as `owner`'s and return None."""
        match = self.find(item)
        if match is None:
            self.remember(item, owner)
        return match

    def find(self, item: Prepared) -> Match | None:
        """Return the match if `item` duplicates a remembered row, remembering nothing."""
        if item.digest is not None and item.digest in self._hashes:
            return Match("exact", self._hashes[item.digest])
        if self._lsh is not None and item.signature is not None and item.shingles is not None:
            # LSH proposes candidates; the exact Jaccard of the 5-gram sets decides.
            hits = [k for k in self._lsh.query(self._lean(item))
                    if jaccard(self._sets[k], item.shingles) >= self.near]  # type: ignore[operator]
            if hits:
                return Match("near", self._owners[min(hits)], min(hits))
        return None

    def remember(self, item: Prepared, owner: int) -> None:
        """Remember `item` as a row of `owner` (later rows matching it are its duplicates)."""
        if self._lsh is not None and item.signature is not None and item.shingles is not None:
            key = len(self._sets)
            self._sets.append(item.shingles)
            self._owners.append(owner)
            self._lsh.insert(key, self._lean(item), check_duplication=False)
        if item.digest is not None:
            self._hashes.setdefault(item.digest, owner)

    def __len__(self) -> int:
        """Return how many texts are remembered (exact digests, else near signatures)."""
        return len(self._hashes) if self.exact else len(self._sets)

    @staticmethod
    def _lean(item: Prepared) -> LeanMinHash:
        return LeanMinHash(seed=1, hashvalues=item.signature, scheme="affine32")
