"""The streaming safetensors writer: files that the safetensors library reads back exactly."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from training.storage.shard_file import ShardFile, write_parts


def test_parts_round_trip_through_the_safetensors_library(tmp_path):
    g = torch.Generator().manual_seed(0)
    parts = {
        "aux": [torch.randn(t, 12, generator=g).to(torch.bfloat16) for t in (3, 5, 1)],
        "aux_q": [torch.randn(t, 12, generator=g).to(torch.float8_e4m3fn) for t in (3, 5, 1)],
        "scale": [torch.rand(t, 3, generator=g) for t in (3, 5, 1)],
        "input_ids": [torch.randint(0, 9000, (t,), generator=g, dtype=torch.int32) for t in (3, 5, 1)],
        "loss_mask": [torch.rand(t, generator=g) > 0.5 for t in (3, 5, 1)],
    }
    path = tmp_path / "x.safetensors"
    size = write_parts(path, parts, {"format": "test/1"})
    assert size == path.stat().st_size
    loaded = load_file(str(path))
    assert set(loaded) == set(parts)
    for name, ps in parts.items():
        want = torch.cat(ps)
        assert loaded[name].dtype == want.dtype and loaded[name].shape == want.shape
        assert torch.equal(loaded[name].view(torch.uint8), want.view(torch.uint8)), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "test/1"}
        assert torch.equal(f.get_slice("aux")[3:8], parts["aux"][1])
    # the data section starts 8-byte aligned, and 4-byte tensors come before narrower ones
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert (8 + n) % 8 == 0


def test_parts_that_disagree_are_refused(tmp_path):
    with pytest.raises(ValueError, match="trailing shape"):
        write_parts(tmp_path / "x", {"a": [torch.zeros(2, 3), torch.zeros(2, 4)]})
    with pytest.raises(ValueError, match="dtype"):
        write_parts(tmp_path / "x", {"a": [torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bfloat16)]})
    with pytest.raises(ValueError, match="no parts"):
        write_parts(tmp_path / "x", {"a": []})


def test_rows_read_with_pread_equal_the_memory_mapped_rows(tmp_path: Path) -> None:
    parts = {"aux": [torch.randn(5, 6).to(torch.bfloat16), torch.randn(3, 6).to(torch.bfloat16)],
             "ids": [torch.arange(5, dtype=torch.int32), torch.arange(3, dtype=torch.int32)],
             "mask": [torch.tensor([True, False, True, True, False]), torch.tensor([False, True, True])],
             "q": [torch.randn(8, 4).to(torch.float8_e4m3fn)]}
    write_parts(tmp_path / "s.safetensors", parts)
    shard = ShardFile(tmp_path / "s.safetensors")
    with safe_open(str(tmp_path / "s.safetensors"), framework="pt") as h:
        for name in parts:
            for lo, hi in ((0, 8), (2, 6), (7, 8), (3, 3)):
                got = shard.get_slice(name)[lo:hi]
                want = h.get_slice(name)[lo:hi]
                assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
                assert got.untyped_storage().nbytes() == got.nbytes  # a tensor of its own, not a view of the file
    shard.close()
