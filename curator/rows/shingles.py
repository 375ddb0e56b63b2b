"""Text as dedup and the traffic's features see it: normalised, then one 64-bit hash per word.

Both near-dedup's 5-gram shingles (curator/mix/dedup.py) and the traffic's hashed n-gram features
(curator/traffic/features.py) start from these word hashes, so a row hashes alike in both.
"""

from __future__ import annotations

import numpy as np

# fixed seed: hashes, and so signatures and features, must not change between runs; drawn from the
# generator dedup used before this module existed, so that its values are unchanged
_BYTE_MULT = np.random.default_rng(20240611).integers(1, 2**63, 64, dtype=np.uint64) | np.uint64(1)


def normalise_text(text: str) -> str:
    """Return `text` lower-cased with runs of whitespace collapsed to one space."""
    return " ".join(text.lower().split())


def mix64(h: np.ndarray) -> np.ndarray:
    """Return splitmix64's finaliser of each value: spreads sum-of-products hashes over all 64 bits."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def word_hashes(joined: str) -> np.ndarray:
    """Return a 64-bit hash per space-separated word of normalised text, in order."""
    data = np.frombuffer(joined.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    is_space = data == 32
    starts = np.concatenate(([0], np.flatnonzero(is_space) + 1))
    pos = np.arange(data.size) - starts[np.cumsum(is_space)]
    contrib = (data.astype(np.uint64) + np.uint64(1)) * _BYTE_MULT[pos & 63]
    contrib[is_space] = 0
    return mix64(np.add.reduceat(contrib, starts))
