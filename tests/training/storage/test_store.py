"""The hidden-state store: what goes in comes out, across shards, sessions, dtypes and crashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.errors import StoreError
from training.storage.format import HiddenStateSample, StoreMeta, bytes_per_token
from training.storage.fp8 import dequantize_fp8, quantize_fp8
from training.storage.index import merge_index
from training.storage.reader import HiddenStateStore
from training.storage.writer import StoreWriter

H = 16


def meta(dtype: str = "bf16", has_final: bool = True) -> StoreMeta:
    return StoreMeta(target="tiny", hidden_size=H, num_layers=8, vocab_size=100, aux_layer_ids=[2, 4, 5],
                     dtype=dtype, has_final=has_final)


def sample(i: int, length: int | None = None, scale: float = 1.0) -> HiddenStateSample:
    g = torch.Generator().manual_seed(i)
    t = length or 3 + i % 7
    return HiddenStateSample(
        id=f"s{i}",
        input_ids=torch.randint(0, 100, (t,), generator=g),
        loss_mask=torch.rand(t, generator=g) > 0.5,
        aux=(torch.randn(t, 3 * H, generator=g) * scale).to(torch.bfloat16),
        final=torch.randn(t, H, generator=g).to(torch.bfloat16),
        category=f"cat{i % 2}",
    )


def test_samples_read_back_exactly_across_many_shards(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, meta(), shard_max_bytes=4000) as w:
        for i in range(20):
            assert w.add(sample(i))
    assert len(list((tmp_path / "shards").glob("*.safetensors"))) > 3
    store = HiddenStateStore.open(tmp_path)
    assert store.ids() == [f"s{i}" for i in range(20)]
    for i in (0, 7, 19):
        want, got = sample(i), store[f"s{i}"]
        assert torch.equal(got.input_ids, want.input_ids) and got.input_ids.dtype == torch.long
        assert torch.equal(got.loss_mask, want.loss_mask)
        assert torch.equal(got.aux, want.aux) and got.aux.dtype == torch.bfloat16
        assert torch.equal(got.final, want.final)
        assert got.category == want.category and store.length(f"s{i}") == len(want)
    assert [s.id for s in store] == store.ids()
    assert store.meta.aux_layer_ids == [2, 4, 5] and store.meta.layer_convention == "layer-input"


def test_resume_appends_and_skips_what_is_already_stored(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, meta(), shard_max_bytes=10**9) as w:
        for i in range(5):
            w.add(sample(i))
    with StoreWriter(tmp_path, meta()) as w:
        assert w.done_ids() == {f"s{i}" for i in range(5)}
        assert not w.add(sample(2))  # already stored: not duplicated
        for i in range(5, 8):
            w.add(sample(i))
    store = HiddenStateStore.open(tmp_path)
    assert store.ids() == [f"s{i}" for i in range(8)]


def test_crash_before_index_write_loses_only_unindexed_samples(tmp_path: Path) -> None:
    w = StoreWriter(tmp_path, meta(), shard_max_bytes=10**9)
    w.add(sample(0))
    w.flush()
    w.add(sample(1))  # buffered, never flushed: the process "dies" here
    del w
    (tmp_path / "shards" / ".orphan.safetensors.tmp").write_bytes(b"half a shard")
    store = HiddenStateStore.open(tmp_path)
    assert store.ids() == ["s0"]
    with StoreWriter(tmp_path, meta()) as w2:
        assert w2.done_ids() == {"s0"}
        w2.add(sample(1))
    assert HiddenStateStore.open(tmp_path).ids() == ["s0", "s1"]


def test_nonfinite_samples_are_skipped_counted_and_not_retried(tmp_path: Path) -> None:
    bad = sample(3)
    bad.aux[1, 5] = float("nan")
    worse = sample(4)
    worse.final[0, 0] = float("inf")
    with StoreWriter(tmp_path, meta()) as w:
        assert w.add(sample(1))
        assert not w.add(bad)
        assert not w.add(worse)
        assert w.skipped_nonfinite == 2
    store = HiddenStateStore.open(tmp_path)
    assert store.ids() == ["s1"]
    assert set(store.skipped) == {"s3", "s4"}
    with StoreWriter(tmp_path, meta()) as w:
        assert {"s3", "s4"} <= w.done_ids()


def test_fp8_halves_bytes_and_round_trip_error_is_bounded(tmp_path: Path) -> None:
    with StoreWriter(tmp_path / "bf16", meta("bf16")) as w:
        for i in range(6):
            w.add(sample(i, length=64, scale=10.0 ** (i % 3)))
    with StoreWriter(tmp_path / "fp8", meta("fp8")) as w:
        for i in range(6):
            w.add(sample(i, length=64, scale=10.0 ** (i % 3)))
    b16, f8 = HiddenStateStore.open(tmp_path / "bf16"), HiddenStateStore.open(tmp_path / "fp8")
    assert f8.disk_bytes() < 0.7 * b16.disk_bytes()  # scales cost 4 B per 16-wide row here
    for sid in f8.ids():
        exact, approx = b16[sid], f8[sid]
        assert approx.aux.dtype == torch.bfloat16
        assert torch.equal(approx.input_ids, exact.input_ids)
        # e4m3 keeps 3 mantissa bits: relative error per element <= 2^-4 of the row's absmax scale.
        for a, e in ((approx.aux, exact.aux), (approx.final, exact.final)):
            rows_e = e.float().reshape(e.shape[0], -1, H)
            rows_a = a.float().reshape(a.shape[0], -1, H)
            amax = rows_e.abs().amax(-1, keepdim=True)
            assert ((rows_a - rows_e).abs() <= amax * 2**-4 + 1e-6).all()
            rel = (rows_a - rows_e).norm() / rows_e.norm()
            assert rel < 0.05


def test_fp8_rows_of_zeros_stay_zero() -> None:
    x = torch.zeros(4, 3 * H)
    q, s = quantize_fp8(x, 3)
    assert torch.equal(dequantize_fp8(q, s).float(), x)


def test_parallel_writers_merge_into_one_index(tmp_path: Path) -> None:
    writers = [StoreWriter(tmp_path, meta(), writer_id=f"r{r}") for r in range(3)]
    for i in range(12):
        writers[i % 3].add(sample(i))
    for w in writers:
        w.close()
    assert len(list((tmp_path / "index-parts").glob("*.json"))) == 3
    assert merge_index(tmp_path) == 12
    assert not list((tmp_path / "index-parts").glob("*.json"))
    store = HiddenStateStore.open(tmp_path)
    assert sorted(store.ids()) == sorted(f"s{i}" for i in range(12))
    assert torch.equal(store["s7"].aux, sample(7).aux)


def test_reopening_with_other_layers_or_dtype_is_refused(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, meta()) as w:
        w.add(sample(0))
    with pytest.raises(StoreError, match="dtype"):
        StoreWriter(tmp_path, meta("fp8"))
    other = meta()
    other.aux_layer_ids = [1, 2, 3]
    with pytest.raises(StoreError, match="aux_layer_ids"):
        StoreWriter(tmp_path, other)


def test_store_without_final_state_and_wrong_shapes(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, meta(has_final=False)) as w:
        s = sample(0)
        s.final = None
        w.add(s)
        with pytest.raises(StoreError, match="do not fit"):
            w.add(HiddenStateSample("bad", torch.arange(4), torch.ones(4, dtype=torch.bool), torch.zeros(4, H)))
    assert HiddenStateStore.open(tmp_path)["s0"].final is None


def test_meta_json_records_what_a_reader_needs(tmp_path: Path) -> None:
    m = meta("fp8")
    m.tokenizer_sha256 = "abc"
    with StoreWriter(tmp_path, m) as w:
        w.add(sample(0))
    data = json.loads((tmp_path / "meta.json").read_text())
    assert data["aux_layer_ids"] == [2, 4, 5] and data["dtype"] == "fp8" and data["tokenizer_sha256"] == "abc"
    assert HiddenStateStore.open(tmp_path).meta == m


def test_opening_a_missing_store_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="curator hidden-states"):
        HiddenStateStore.open(tmp_path)


def test_bytes_per_token_counts_aux_final_and_scales() -> None:
    assert bytes_per_token(4096, 3, "bf16", False) == 3 * 4096 * 2 + 5
    assert bytes_per_token(4096, 3, "bf16", True) == 4 * 4096 * 2 + 5
    assert bytes_per_token(4096, 3, "fp8", True) == 4 * (4096 + 4) + 5


def test_fp8_quantised_upstream_stores_the_same_bytes_as_quantised_by_the_writer(tmp_path: Path) -> None:
    from training.storage.fp8 import quantize_fp8

    meta = StoreMeta(target="t", hidden_size=8, num_layers=6, vocab_size=50, aux_layer_ids=[1, 2, 3], dtype="fp8",
                     has_final=True)
    gen = torch.Generator().manual_seed(0)
    samples = [HiddenStateSample(f"s{i}", torch.arange(5), torch.ones(5, dtype=torch.bool),
                                 torch.randn(5, 24, generator=gen) * 10 ** i, torch.randn(5, 8, generator=gen))
               for i in range(3)]
    with StoreWriter(tmp_path / "writer", meta) as w:
        for s in samples:
            w.add(s)
    with StoreWriter(tmp_path / "upstream", meta) as w:
        for s in samples:
            aq, asc = quantize_fp8(s.aux, 3)
            fq, fsc = quantize_fp8(s.final, 1)
            w.add(HiddenStateSample(s.id, s.input_ids, s.loss_mask, aq, fq, finite=True, aux_scale=asc, final_scale=fsc))
    a, b = HiddenStateStore.open(tmp_path / "writer"), HiddenStateStore.open(tmp_path / "upstream")
    for sid in a.ids():
        assert torch.equal(a[sid].aux, b[sid].aux) and torch.equal(a[sid].final, b[sid].final)


def test_fp8_read_as_stored_and_dequantised_on_the_device_equals_dequantised_on_read(tmp_path: Path) -> None:
    from training.feed.batches import load_batch

    with StoreWriter(tmp_path, meta("fp8"), shard_max_bytes=2_000) as w:
        for i in range(6):
            w.add(sample(i))
    on_read = HiddenStateStore.open(tmp_path)
    as_stored = HiddenStateStore.open(tmp_path, dequantize=False)
    raw = as_stored["s3"]
    assert raw.aux.dtype == torch.float8_e4m3fn and raw.aux_scale is not None and raw.final_scale is not None
    ids = ["s0", "s3", "s5"]
    want = load_batch(on_read, ids, max_length=8).to(torch.device("cpu"), torch.float32)
    quantized = load_batch(as_stored, ids, max_length=8)
    assert quantized.aux.dtype == torch.float8_e4m3fn and quantized.aux_scale.shape == (3, quantized.aux.shape[1], 3)
    got = quantized.to(torch.device("cpu"), torch.float32)
    # the same values (bf16 rounding on read aside), and zeros on padding
    assert torch.allclose(got.aux, want.aux, rtol=1e-2, atol=1e-3)
    assert torch.allclose(got.final, want.final, rtol=1e-2, atol=1e-3)
    assert torch.equal(got.loss_mask, want.loss_mask) and torch.equal(got.input_ids, want.input_ids)


def test_store_reads_from_several_threads_agree(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with StoreWriter(tmp_path, meta(), shard_max_bytes=1_500) as w:
        for i in range(40):
            w.add(sample(i))
    store = HiddenStateStore.open(tmp_path)
    store_ids = store.ids() * 5
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda sid: store[sid], store_ids))
    for sid, s in zip(store_ids, got):
        assert s.id == sid and torch.equal(s.aux, sample(int(sid[1:])).aux)


def test_fp8_samples_are_refused_by_a_bf16_store_and_scales_must_fit(tmp_path: Path) -> None:
    s = sample(1, length=4)
    q, scale = quantize_fp8(s.aux, 3)
    fq, fscale = quantize_fp8(s.final, 1)
    fp8_sample = HiddenStateSample("q", s.input_ids, s.loss_mask, q, fq, aux_scale=scale, final_scale=fscale)
    with StoreWriter(tmp_path / "bf16", meta("bf16")) as w:
        with pytest.raises(StoreError, match="fp8 values with scales"):
            w.add(fp8_sample)
    with StoreWriter(tmp_path / "fp8", meta("fp8")) as w:
        with pytest.raises(StoreError, match="aux_scale"):
            w.add(HiddenStateSample("q", s.input_ids, s.loss_mask, q, fq, aux_scale=scale[:, :2], final_scale=fscale))
        assert w.add(fp8_sample)
    assert torch.allclose(HiddenStateStore.open(tmp_path / "fp8")["q"].aux.float(), s.aux.float(), rtol=0.07, atol=1e-2)


def test_fp8_quantisation_of_zero_tokens() -> None:
    q, scale = quantize_fp8(torch.zeros(0, 3 * H), 3)
    assert q.shape == (0, 3 * H) and scale.shape == (0, 3)
    assert dequantize_fp8(q, scale).shape == (0, 3 * H)


@pytest.mark.parametrize("folder", ["shards", "index-parts"])
def test_a_store_folder_planted_as_a_link_is_refused_and_nothing_lands_outside(tmp_path: Path, folder: str) -> None:
    """`hidden-states --out st` with st/shards a link once wrote its shards outside (sweep 2026-12-04 item 3)."""
    from training.io.atomic import OutputPathError
    from training.storage.writer import claim_store

    outside = tmp_path / "outside"
    outside.mkdir()
    stray = outside / "theirs.safetensors"  # no index of the store names it: the sweep of leftovers would delete it
    stray.write_bytes(b"someone's file")
    store = tmp_path / "store"
    store.mkdir()
    (store / folder).symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutputPathError, match=f"{folder} is a link"):
        StoreWriter(store, meta())
    (store / "meta.json").write_text(json.dumps(meta().to_json()))  # a store that exists: claiming it sweeps leftovers
    with pytest.raises(OutputPathError, match=f"{folder} is a link"):
        claim_store(store)
    assert sorted(p.name for p in outside.iterdir()) == ["theirs.safetensors"]
    assert stray.read_bytes() == b"someone's file"
