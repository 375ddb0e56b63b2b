"""A store is checked against its shards when it is opened: a hostile or damaged index is refused
with a StoreIntegrityError that names the file, the sample and the field, before anything is read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from curator.cli import main
from training.errors import StoreIntegrityError
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.index import merge_index
from training.storage.reader import HiddenStateStore
from training.storage.writer import StoreWriter

H = 8


def make_store(root: Path, n: int = 4) -> Path:
    """Write `n` samples of 5 tokens into one shard of a store at `root`, merged into index.json; return it."""
    meta = StoreMeta(target="tiny", hidden_size=H, num_layers=6, vocab_size=50, aux_layer_ids=[1, 2, 3])
    g = torch.Generator().manual_seed(0)
    with StoreWriter(root, meta) as w:
        for i in range(n):
            w.add(HiddenStateSample(id=f"s{i}", input_ids=torch.randint(0, 50, (5,), generator=g),
                                    loss_mask=torch.ones(5, dtype=torch.bool),
                                    aux=torch.randn(5, 3 * H, generator=g).to(torch.bfloat16),
                                    final=torch.randn(5, H, generator=g).to(torch.bfloat16)))
    merge_index(root)
    return root


def edit_index(root: Path, sid: str, **fields: object) -> None:
    index = json.loads((root / "index.json").read_text())
    index["samples"][sid].update(fields)
    (root / "index.json").write_text(json.dumps(index))


def only_shard(root: Path) -> Path:
    (shard,) = (root / "shards").glob("*.safetensors")
    return shard


def test_a_shard_path_leading_out_of_the_store_is_refused_and_never_read(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    # a valid shard planted outside the store, where "../../outside.safetensors" from shards/ leads
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(only_shard(store).read_bytes())
    edit_index(store, "s1", shard="../../outside.safetensors")
    with pytest.raises(StoreIntegrityError, match=r"index\.json: sample 's1': shard '\.\./\.\./outside"):
        HiddenStateStore.open(store)


def test_a_shard_that_links_out_of_the_store_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(only_shard(store).read_bytes())
    os.symlink(outside, store / "shards" / "linked.safetensors")
    edit_index(store, "s2", shard="linked.safetensors")
    with pytest.raises(StoreIntegrityError, match=r"linked\.safetensors \(sample 's2'\) is a link to .*outside"):
        HiddenStateStore.open(store)


def test_an_index_length_past_the_end_of_its_shard_is_named(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    edit_index(store, "s3", length=9)  # the shard has 4 x 5 = 20 rows; s3 starts at 15
    with pytest.raises(StoreIntegrityError, match=r"sample 's3': offset 15 \+ length 9 runs past the end of shard .*\(20 rows\)"):
        HiddenStateStore.open(store)


@pytest.mark.parametrize("field, value, says", [
    ("offset", -3, "offset is -3, not an integer >= 0"),
    ("length", 0, "length is 0, not an integer >= 1"),
    ("length", "5", "length is '5', not an integer >= 1"),
    ("offset", True, "offset is True, not an integer >= 0"),
])
def test_bad_offsets_and_lengths_are_named(tmp_path: Path, field: str, value: object, says: str) -> None:
    store = make_store(tmp_path / "store")
    edit_index(store, "s0", **{field: value})
    with pytest.raises(StoreIntegrityError, match=f"index.json: sample 's0': {says}"):
        HiddenStateStore.open(store)


def test_a_truncated_shard_is_named_when_the_store_opens(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    shard = only_shard(store)
    shard.write_bytes(shard.read_bytes()[:-64])
    with pytest.raises(StoreIntegrityError, match=f"shard {shard} is damaged .*copied completely"):
        HiddenStateStore.open(store)


@pytest.mark.parametrize("name, cut, says", [
    ("loss_mask", lambda t: t[:-2], r"tensor 'loss_mask' has 18 rows where input_ids has 20"),  # a short loss mask
    ("aux", lambda t: t[:, : 2 * H].contiguous(), r"tensor 'aux' is BF16 \[20, 16\], expected BF16 \[rows, 24\]"),
])
def test_a_shard_tensor_that_does_not_fit_the_meta_is_named(tmp_path: Path, name: str, cut, says: str) -> None:
    store = make_store(tmp_path / "store")
    shard = only_shard(store)
    tensors = load_file(str(shard))
    tensors[name] = cut(tensors[name])
    save_file(tensors, str(shard))
    with pytest.raises(StoreIntegrityError, match=says):
        HiddenStateStore.open(store)


def test_an_index_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    (store / "index.json").write_text(json.dumps({"samples": {"s0": ["shard", 0, 5]}}))
    with pytest.raises(StoreIntegrityError, match="sample 's0': entry is list, not an object"):
        HiddenStateStore.open(store)
    (store / "index.json").write_text(json.dumps([1, 2]))
    with pytest.raises(StoreIntegrityError, match="index.json is not a store index"):
        HiddenStateStore.open(store)


def test_a_sound_store_opens_and_reads_back(tmp_path: Path) -> None:
    store = HiddenStateStore.open(make_store(tmp_path / "store"))
    assert store.ids() == ["s0", "s1", "s2", "s3"] and len(store["s3"]) == 5


def test_curator_train_prints_a_damaged_store_as_one_line(tmp_path: Path, tiny_target: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    store = make_store(tmp_path / "store")
    edit_index(store, "s1", shard="../../outside.safetensors")
    code = main(["train", f"data={store}", f"target={tiny_target}", f"out={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    said = err[err.index("error: "):]  # after the progress bar the run had started
    assert code == 1 and "Traceback" not in err and "unexpected" not in err
    assert "sample 's1': shard '../../outside.safetensors'" in "".join(said.splitlines())
