"""torchrun plumbing: which rank this process is, its device, and sums over all ranks.

Started by torchrun (RANK/WORLD_SIZE/LOCAL_RANK set), the process joins the group: NCCL on
CUDA, gloo on CPU. Started plainly, it is rank 0 of 1 and every collective is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from training.errors import TrainingError
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """Return the device for "auto" | "cpu" | "cuda" | "cuda:N" (auto: this rank's GPU if any)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise TrainingError(f"--device {name!r} is not a device: use auto, cpu, cuda or cuda:N") from exc


def init_distributed(device: str = "auto") -> DistInfo:
    """Return this process's rank, world size and device, joining the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Return `t` summed over all ranks (in place; `t` itself when not distributed)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown(clean: bool = True) -> None:
    """Leave the process group if this process joined one (after a failure: without waiting)."""
    if dist.is_available() and dist.is_initialized():
        # On a clean finish every rank reaches this point before any tears the group down: a gloo
        # rank whose peer has already gone can abort (SIGABRT) in its transport thread.
        if clean and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
