"""The engine feed's window, cache and checks, with a Capture that computes states locally (no HTTP)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from training.capture.prepare import PreparedSample
from training.errors import TrainingError
from training.feed.engine import EngineFeedError, EngineStates, SampleCache, parse_bytes, sample_bytes
from training.storage.format import HiddenStateSample, StoreMeta

META = StoreMeta(target="t", hidden_size=4, num_layers=4, vocab_size=50, aux_layer_ids=[1, 2, 3])


def prepared(n: int) -> dict[str, PreparedSample]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(n):
        t = 3 + i % 5
        out[f"s{i:03d}"] = PreparedSample(f"s{i:03d}", "chat", torch.randint(0, 50, (t,), generator=g),
                                          torch.ones(t, dtype=torch.bool))
    return out


def states_of(s: PreparedSample) -> HiddenStateSample:
    base = s.input_ids.float()[:, None]
    return HiddenStateSample(s.id, s.input_ids, s.loss_mask, base.repeat(1, 12).bfloat16(),
                             base.repeat(1, 4).bfloat16(), s.category)


class LocalCapture:
    """Captures on a pool, counting how many captures are out at once; optional wrong answers."""

    def __init__(self, delay_s: float = 0.0, wrong: set[str] = frozenset()) -> None:
        self.pool = ThreadPoolExecutor(4)
        self.delay_s, self.wrong = delay_s, wrong
        self.submitted: list[str] = []
        self.closed = False

    def _one(self, s: PreparedSample) -> HiddenStateSample:
        time.sleep(self.delay_s)
        got = states_of(s)
        if s.id in self.wrong:
            got.aux = got.aux[:, :8]  # one layer short
        return got

    def submit(self, s: PreparedSample) -> Future[HiddenStateSample]:
        self.submitted.append(s.id)
        return self.pool.submit(self._one, s)

    def close(self) -> None:
        self.closed = True
        self.pool.shutdown(wait=True)


def schedule(ids: list[str], per_step: int):
    for k in range(0, len(ids), per_step):
        yield k // per_step, ids[k:k + per_step]


def test_the_window_bounds_captures_ahead_and_release_moves_it() -> None:
    samples = prepared(40)
    cap = LocalCapture()
    feed = EngineStates(samples, META, lambda: cap, root="gen", max_length=100, window_samples=8)
    ids = list(samples)
    feed.start(schedule(ids, 4))
    time.sleep(0.3)
    assert len(cap.submitted) == 8  # two steps ahead, then it waits
    got = feed.for_step(0).load_many(ids[:4])
    assert [s.id for s in got] == ids[:4] and torch.equal(got[0].aux, states_of(samples[ids[0]]).aux)
    time.sleep(0.2)
    assert len(cap.submitted) == 8  # loading is not releasing: the step still trains on them
    feed.release(0)
    time.sleep(0.3)
    assert len(cap.submitted) == 12
    for step in range(1, 10):
        feed.for_step(step).load_many(ids[4 * step:4 * step + 4])
        feed.release(step)
    assert cap.submitted == ids and feed.stats.window_high_samples == 8
    feed.close()
    assert cap.closed


def test_a_byte_budget_smaller_than_a_step_still_feeds_the_next_step() -> None:
    samples = prepared(12)
    cap = LocalCapture()
    feed = EngineStates(samples, META, lambda: cap, root="gen", max_length=100, window_samples=100, window_bytes=1)
    ids = list(samples)
    feed.start(schedule(ids, 4))
    for step in range(3):
        assert len(feed.for_step(step).load_many(ids[4 * step:4 * step + 4])) == 4
        feed.release(step)
    feed.close()


def test_wrong_states_stop_the_feed_by_name() -> None:
    samples = prepared(8)
    ids = list(samples)
    cap = LocalCapture(wrong={ids[2]})
    feed = EngineStates(samples, META, lambda: cap, root="gen", max_length=100, window_samples=8)
    feed.start(schedule(ids, 4))
    with pytest.raises(EngineFeedError, match=f"{ids[2]}.*aux states"):
        feed.for_step(0).load_many(ids[:4])
    feed.close()


def test_float32_engine_states_are_rounded_as_a_store_rounds_them() -> None:
    samples = prepared(2)

    class Float32(LocalCapture):
        def _one(self, s: PreparedSample) -> HiddenStateSample:
            got = states_of(s)
            got.aux, got.final = got.aux.float() / 3, got.final.float() / 3  # not representable in bf16
            return got

    cap = Float32()
    feed = EngineStates(samples, META, lambda: cap, root="gen", max_length=100)
    got = feed.load_many(list(samples))
    want = states_of(samples["s000"])
    assert got[0].aux.dtype == torch.bfloat16 and torch.equal(got[0].aux, (want.aux.float() / 3).to(torch.bfloat16))
    feed.close()


def test_samples_are_asked_for_cut_to_max_length() -> None:
    samples = prepared(6)
    cap = LocalCapture()
    feed = EngineStates(samples, META, lambda: cap, root="gen", max_length=4, window_samples=8)
    got = feed.load_many(list(samples))  # not scheduled: captured on demand
    assert all(len(s) <= 4 for s in got) and feed.stats.on_demand == 6
    feed.close()


def test_the_cache_stays_within_its_budget_and_serves_the_next_epoch(tmp_path: Path) -> None:
    samples = prepared(20)
    ids = list(samples)
    budget = sum(sample_bytes(META, len(samples[s].input_ids)) for s in ids[:5])
    cache = SampleCache(tmp_path / "c", budget, META, ids)
    cap = LocalCapture()
    feed = EngineStates(samples, META, lambda: cap, root="gen", max_length=100, window_samples=8, cache=cache)
    epochs = [ids, list(reversed(ids))]
    feed.start(schedule(epochs[0] + epochs[1], 4))
    for step in range(10):
        order = (epochs[0] + epochs[1])[4 * step:4 * step + 4]
        got = feed.for_step(step).load_many(order)
        assert [s.id for s in got] == order
        assert all(torch.equal(g.aux, states_of(samples[g.id]).aux) for g in got)
        feed.release(step)
    feed.close()
    on_disk = sum(p.stat().st_size for p in (tmp_path / "c").iterdir())
    assert 0 < on_disk <= budget and feed.stats.cache_hits == len(cache._kept)
    assert len(cap.submitted) == 40 - feed.stats.cache_hits
    # a resumed run finds the same cache, by the names of its own samples only
    (tmp_path / "c" / "foreign.safetensors").write_bytes(b"x")
    again = SampleCache(tmp_path / "c", budget, META, ids)
    assert again.bytes == cache.bytes and (tmp_path / "c" / "foreign.safetensors").exists()


def test_a_corrupt_cache_file_is_named(tmp_path: Path) -> None:
    samples = prepared(2)
    cache = SampleCache(tmp_path / "c", 10**6, META, list(samples))
    s = samples["s000"]
    cache.put(states_of(s))
    (tmp_path / "c" / SampleCache.name("s000")).write_bytes(b"garbage")
    with pytest.raises(EngineFeedError, match="s000.*unreadable"):
        cache.get(s, len(s.input_ids))


def test_a_closed_feed_fails_waiting_loads_at_once() -> None:
    samples = prepared(8)
    ids = list(samples)
    cap = LocalCapture(delay_s=5.0)
    feed = EngineStates(samples, META, lambda: cap, root="gen", max_length=100, window_samples=8)
    feed.start(schedule(ids, 4))
    errors: list[BaseException] = []

    def load() -> None:
        try:
            feed.for_step(1).load_many(ids[4:])
        except EngineFeedError as exc:
            errors.append(exc)

    t = threading.Thread(target=load)
    t.start()
    time.sleep(0.2)
    feed.stop_schedule()
    t.join(timeout=3)
    assert not t.is_alive() and errors
    cap.pool.shutdown(wait=False, cancel_futures=True)


@pytest.mark.parametrize(("text", "n"), [("500GB", 500 * 10**9), ("8 GiB", 8 * 2**30), ("1.5TB", 15 * 10**11),
                                          ("1000", 1000), ("", 0), ("0", 0), (7, 7)])
def test_sizes(text: str | int, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["lots", "5XB", "-1GB"])
def test_bad_sizes_are_named(text: str) -> None:
    with pytest.raises(TrainingError, match="size"):
        parse_bytes(text)
