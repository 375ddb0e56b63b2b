"""Samples packed end to end into one row per micro-batch, with no padding.

Real mixes are not one length: a micro-batch padded to its longest sample spends its time on
padding, and a long sample next to short ones multiplies it. Packed, a micro-batch is the
samples laid end to end in one row [1, N]; `bounds` (and `cu_seqlens`, the same on the device)
say where each starts, `positions` restart at 0 in each, and the TTT attention
(training.eagle3.ttt_attention) and objective (objective.PackedTTTObjective) never let one sample see
or predict another's tokens, so each sample trains exactly as it would alone in a padded batch.

Which samples share an optimizer step is unchanged (the global batches of batches.epoch_batches);
packing only decides how a rank's share is cut into micro-batches: first-fit over a token budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from training.feed.batches import Batch, States
from training.errors import StoreError
from training.storage.fp8 import dequantize_fp8


@dataclass
class PackedBatch:
    ids: list[str]
    input_ids: torch.Tensor  # [1, N] int64
    loss_mask: torch.Tensor  # [1, N] bool
    aux: torch.Tensor  # [1, N, 3*Ht]: bf16/float32, or fp8 values with aux_scale
    final: torch.Tensor  # [1, N, H]: likewise, with final_scale
    positions: torch.Tensor  # [1, N] int64: index of each token within its sample
    doc_ids: torch.Tensor  # [1, N] int32: which sample each token belongs to
    cu_seqlens: torch.Tensor  # [S + 1] int32: sample boundaries (on the batch's device)
    bounds: list[int]  # the same boundaries as host ints
    aux_scale: torch.Tensor | None = None  # [1, N, 3] float32 when aux is fp8 as stored
    final_scale: torch.Tensor | None = None  # [1, N, 1]

    @property
    def tokens(self) -> int:
        return self.bounds[-1]

    def pin_memory(self) -> PackedBatch:
        """Return the batch in page-locked host memory, so that `to(non_blocking=True)` overlaps."""
        if self.input_ids.device.type != "cpu" or not torch.cuda.is_available():
            return self

        def pin(x: torch.Tensor) -> torch.Tensor:
            return x.pin_memory()

        def pin_scale(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.pin_memory()

        return PackedBatch(self.ids, pin(self.input_ids), pin(self.loss_mask), pin(self.aux), pin(self.final),
                           pin(self.positions), pin(self.doc_ids), pin(self.cu_seqlens), self.bounds,
                           pin_scale(self.aux_scale), pin_scale(self.final_scale))

    def to(self, device: torch.device, dtype: torch.dtype, non_blocking: bool = False) -> PackedBatch:
        """Return the batch on `device` in `dtype`; fp8 states cross as fp8 and are dequantised there."""

        def move(x: torch.Tensor) -> torch.Tensor:
            return x.to(device, non_blocking=non_blocking)

        def states(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
            if scale is None:
                return move(x).to(dtype)
            return dequantize_fp8(move(x), move(scale), dtype)

        return PackedBatch(self.ids, move(self.input_ids), move(self.loss_mask), states(self.aux, self.aux_scale),
                           states(self.final, self.final_scale), move(self.positions), move(self.doc_ids),
                           move(self.cu_seqlens), self.bounds)

    def valid(self) -> torch.Tensor:
        """Return [1, N] bool: the target's prediction at p counts when p+1 is a loss token of the same sample."""
        valid = torch.zeros_like(self.loss_mask)
        valid[:, :-1] = self.loss_mask[:, 1:] & (self.doc_ids[:, :-1] == self.doc_ids[:, 1:])
        return valid

    def step_counts(self, ttt_steps: int) -> torch.Tensor:
        """Return float64 [ttt_steps]: the loss positions of each TTT step, as objective.step_counts counts them."""
        valid, doc = self.valid()[0], self.doc_ids[0]
        return torch.stack([step_valid(valid, doc, k).sum() for k in range(ttt_steps)]).double()


def step_valid(valid: torch.Tensor, doc: torch.Tensor, k: int) -> torch.Tensor:
    """Return [max(N - 1 - k, 0)] bool: the origins t of a packed row [N] whose TTT step-k target counts.

    Step k at origin t predicts the target's prediction at t+1+k: it counts when that position is
    valid (`PackedBatch.valid`) and of the same sample as t.
    """
    n = max(valid.shape[0] - 1 - k, 0)
    return valid[1 + k :] & (doc[:n] == doc[1 + k :])


def _layout(lengths: Sequence[int], device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Return (positions [N], doc ids [N], bounds) for samples of `lengths` laid end to end."""
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + int(n))
    lens = torch.tensor([int(n) for n in lengths])
    doc = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lens)
    starts = torch.tensor(bounds[:-1])
    positions = torch.arange(bounds[-1]) - torch.repeat_interleave(starts, lens)
    if device is not None:
        positions, doc = positions.to(device), doc.to(device)
    return positions, doc, bounds


def pack_samples(store: States, ids: Sequence[str], max_length: int) -> PackedBatch:
    """Return the samples `ids`, each cut to `max_length`, packed into one row with no padding.

    Samples read as stored fp8 stay fp8 with their scales until `PackedBatch.to`, as in load_batch.
    """
    samples = store.load_many(list(ids))
    if any(s.final is None for s in samples):
        raise StoreError(f"{store.root} keeps no final hidden states; capture with them to train offline")
    cut = [min(max_length, len(s)) for s in samples]
    quantized = samples[0].aux_scale is not None and samples[0].final_scale is not None
    cat = lambda xs: torch.cat(xs)[None]  # noqa: E731
    device = samples[0].aux.device  # online states are on the GPU already
    positions, doc, bounds = _layout(cut)
    return PackedBatch(
        list(ids),
        cat([s.input_ids[:n].long() for s, n in zip(samples, cut)]).to(device),
        cat([s.loss_mask[:n].bool() for s, n in zip(samples, cut)]).to(device),
        cat([s.aux[:n] for s, n in zip(samples, cut)]),
        cat([s.final[:n] for s, n in zip(samples, cut)]),  # type: ignore[index]
        positions[None].to(device),
        doc[None].to(device),
        torch.tensor(bounds, dtype=torch.int32, device=device),
        bounds,
        cat([s.aux_scale[:n] for s, n in zip(samples, cut)]) if quantized else None,  # type: ignore[index]
        cat([s.final_scale[:n] for s, n in zip(samples, cut)]) if quantized else None,  # type: ignore[index]
    )


def from_padded(batch: Batch) -> PackedBatch:
    """Return a padded batch [B, T] as one packed row of B samples of T tokens each (padding kept, never trained)."""
    B, T = batch.input_ids.shape
    positions, doc, bounds = _layout([T] * B, batch.input_ids.device)

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(1, B * T, *x.shape[2:])

    def flat_scale(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else flat(x)

    return PackedBatch(batch.ids, flat(batch.input_ids), flat(batch.loss_mask), flat(batch.aux), flat(batch.final),
                       positions[None], doc[None], torch.tensor(bounds, dtype=torch.int32,
                                                                device=batch.input_ids.device),
                       bounds, flat_scale(batch.aux_scale), flat_scale(batch.final_scale))


def plan_micro_batches(ids: Sequence[str], lengths: dict[str, int], token_budget: int) -> list[list[str]]:
    """Return `ids` grouped into micro-batches of at most `token_budget` tokens (first fit, longest first).

    A sample longer than the budget gets a micro-batch of its own. Deterministic in (ids, lengths).
    """
    order = sorted(ids, key=lambda s: (-lengths[s], s))
    bins: list[list[str]] = []
    room: list[int] = []
    for sid in order:
        n = lengths[sid]
        for i, free in enumerate(room):
            if n <= free:
                bins[i].append(sid)
                room[i] -= n
                break
        else:
            bins.append([sid])
            room.append(token_budget - n)
    return bins


class DeviceCopier:
    """Moves packed batches to the device on a side stream, so the copy overlaps the step before it.

    `start` queues the copy (from pinned memory: see PackedBatch.pin_memory) and returns at once;
    `wait` makes the compute stream wait for it and returns the batch on the device. On the CPU
    both are a plain `to`.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def start(self, batch: PackedBatch) -> PackedBatch:
        if self.stream is None:
            return batch.to(self.device, self.dtype)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # inputs made on the compute stream
        with torch.cuda.stream(self.stream):
            return batch.to(self.device, self.dtype, non_blocking=True)

    def wait(self, moved: PackedBatch) -> PackedBatch:
        if self.stream is None:
            return moved
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for x in (moved.input_ids, moved.loss_mask, moved.aux, moved.final, moved.positions, moved.doc_ids,
                  moved.cu_seqlens):
            x.record_stream(current)  # made on the side stream, freed after use on this one
        return moved
