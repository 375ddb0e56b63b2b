"""The price of each way to feed a multi-epoch run: a full store, capturing again every epoch
(engine-fed), or engine-fed with a cache kept up to a disk budget.

Per choice: the disk high-water mark, the target prefill tokens of each epoch, and the capture
time at a measured rate (prefill tokens per second per capture server). The engine-fed window
(prefetch_samples samples, in host memory; their files pass through the engine's shared folder)
is counted in the disk high-water mark of both engine-fed choices as an upper bound (the client
removes each engine file as soon as it has read it, so only the requests in flight are on disk at
once), and shown apart as the host memory it takes. Which samples a cache keeps is the
first ones the trainer consumes, a random draw of the data (epoch order is shuffled), so a budget
B keeps about B / (bytes per token) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.errors import TrainingError


@dataclass
class FeedChoice:
    name: str
    disk_high_water: int  # bytes, at most: the store, or cache + window
    window_bytes: int  # host memory of the engine-fed window (0 for a store)
    prefill_per_epoch: list[int]  # target prefill tokens in each epoch
    capture_s: float | None  # at the given rate and server count; None without a rate
    notes: list[str] = field(default_factory=list)

    @property
    def prefill_total(self) -> int:
        return sum(self.prefill_per_epoch)


def price_feeds(
    *, tokens: int, samples: int, bytes_per_token: int, epochs: int, cache_budget: int = 0,
    window_samples: int = 64, capture_rate: float | None = None, servers: int = 1,
) -> list[FeedChoice]:
    """Return the three choices priced for `tokens` over `samples` (after clipping), `epochs` epochs."""
    if epochs < 1 or samples < 1 or tokens < 1 or servers < 1:
        raise TrainingError("epochs, samples, tokens and servers must be >= 1")
    if capture_rate is not None and capture_rate <= 0:
        raise TrainingError("--capture-rate must be a positive prefill rate (tokens/s per server)")
    full = tokens * bytes_per_token
    window = min(samples, window_samples) * (tokens / samples) * bytes_per_token

    def time_of(prefill: int) -> float | None:
        return prefill / (capture_rate * servers) if capture_rate else None

    store = FeedChoice("full store", full, 0, [tokens] + [0] * (epochs - 1), time_of(tokens))
    again = FeedChoice("engine-fed, capture every epoch", round(window), round(window), [tokens] * epochs,
                       time_of(tokens * epochs))
    choices = [store, again]
    if cache_budget > 0:
        kept = min(tokens, cache_budget // bytes_per_token)
        later = tokens - kept
        prefill = [tokens] + [later] * (epochs - 1)
        cached = FeedChoice(f"engine-fed, cache up to {cache_budget:,} B", round(min(cache_budget, full) + window),
                            round(window), prefill, time_of(sum(prefill)))
        cached.notes.append(f"keeps {kept / tokens:.0%} of the tokens after the first epoch")
        choices.append(cached)
    return choices


def servers_to_keep_up(train_tokens_per_s: float, capture_tokens_per_s: float, cached_fraction: float = 0.0) -> float:
    """Return how many capture servers keep one trainer busy: the tokens it trains per second that are
    not read from a cache, over what one server prefills per second."""
    if capture_tokens_per_s <= 0:
        raise TrainingError("the capture rate must be positive")
    return train_tokens_per_s * (1 - cached_fraction) / capture_tokens_per_s
