"""The price of a full store against engine-fed training, per epoch."""

from __future__ import annotations

import pytest

from training.capture.feed_plan import price_feeds, servers_to_keep_up
from training.errors import TrainingError


def test_kimi_100k_three_epochs_with_a_500gb_cache() -> None:
    tokens, bpt = 100_000 * 2_103, 4 * 7168 * 2 + 5  # aux + final, bf16, with ids and mask
    store, again, cached = price_feeds(tokens=tokens, samples=100_000, bytes_per_token=bpt, epochs=3,
                                       cache_budget=500 * 10**9, window_samples=64, capture_rate=50_000, servers=2)
    assert store.disk_high_water == tokens * bpt and round(store.disk_high_water / 1e12, 1) == 12.1
    assert store.prefill_per_epoch == [tokens, 0, 0]
    assert again.prefill_per_epoch == [tokens] * 3 and again.disk_high_water < 8 * 10**9  # 64 samples' worth
    kept = 500 * 10**9 // bpt
    assert cached.prefill_per_epoch == [tokens, tokens - kept, tokens - kept]
    assert 500 * 10**9 < cached.disk_high_water < 508 * 10**9
    assert again.capture_s == pytest.approx(3 * tokens / 100_000)
    assert servers_to_keep_up(25_800, 50_000) == pytest.approx(0.516)


def test_a_budget_larger_than_the_store_costs_what_the_store_costs() -> None:
    _, _, cached = price_feeds(tokens=1000, samples=10, bytes_per_token=10, epochs=2, cache_budget=10**9)
    assert cached.prefill_per_epoch == [1000, 0] and cached.disk_high_water == 10_000 + 10 * 100 * 10


def test_nonsense_is_refused() -> None:
    with pytest.raises(TrainingError):
        price_feeds(tokens=1, samples=1, bytes_per_token=1, epochs=0)
    with pytest.raises(TrainingError):
        price_feeds(tokens=1, samples=1, bytes_per_token=1, epochs=1, capture_rate=0)
