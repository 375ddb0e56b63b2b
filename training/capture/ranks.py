"""Data-parallel capture: which samples a rank owns, claiming the store for a world of ranks, and rank
0's merge of every rank's index part at the end.

Each rank takes the samples whose id hashes to it and writes its own shards and index part; ranks
skip everything an earlier run stored, so a re-run with another world size resumes correctly.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from training.capture.stats import ExtractStats
from training.io.outlock import OutputBusyError, OutputLock
from training.storage.index import merge_index
from training.storage.writer import claim_store


def owns(sample_id: str, rank: int, world_size: int) -> bool:
    """Return whether `rank` of `world_size` captures `sample_id` (a stable hash, same on every run)."""
    if world_size <= 1:
        return True
    return int(hashlib.sha256(sample_id.encode("utf-8")).hexdigest()[:16], 16) % world_size == rank


def finish_ranks(stats: ExtractStats, out_dir: str | Path, world_size: int) -> ExtractStats:
    """Wait for every rank, merge the index on rank 0, and return the counts summed over ranks."""
    if world_size > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, asdict(stats))
        total = ExtractStats()
        for g in gathered:
            total.add(ExtractStats(**g))
        if dist.get_rank() == 0:
            merge_index(out_dir)
        dist.barrier()
        return total
    merge_index(out_dir)
    return stats


def claim_for_ranks(out_dir: str | Path, rank: int, world_size: int) -> OutputLock | None:
    """Return the store's lock, held by rank 0 (None elsewhere); every rank raises when another run writes the store."""
    lock, refusal = None, None
    if rank == 0:
        try:
            lock = claim_store(out_dir)
        except OutputBusyError as exc:
            refusal = str(exc)
    if world_size > 1:
        import torch.distributed as dist

        box = [refusal]
        dist.broadcast_object_list(box, src=0)
        refusal = box[0]
    if refusal is not None:
        raise OutputBusyError(refusal)
    return lock


