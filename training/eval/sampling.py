"""Sampled verification for `curator eval` at temperature > 0: one draw of the target per tree node.

SGLang's target-only tree speculative sampling with its default thresholds (1.0) tries a node's
children in order against one coin and accepts child c with probability p(c), drawing the bonus
token from p without the rejected ones; one draw x ~ p per node, accepting the child equal to x,
has exactly that law (training.eval.decode runs it).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from training.errors import TrainingError


@dataclass(frozen=True)
class Sampling:
    """The target's sampling in verification, applied as SGLang applies it: softmax(logits / T),
    then top-k, then top-p renormalisation (0 and 1.0 leave them off)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise TrainingError(f"temperature {self.temperature}: sampled verification needs a finite T > 0 "
                                "(greedy verification is the default)")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise TrainingError(f"top_k {self.top_k} must be >= 0 and top_p {self.top_p} in (0, 1]")
        if not 0 <= self.seed < 2**32:
            raise TrainingError(f"seed {self.seed} must be in [0, 2**32)")

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Return the sampling distribution [..., V] for logits [..., V]."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if 0 < self.top_k < probs.shape[-1]:
            kth = probs.topk(self.top_k, dim=-1).values[..., -1:]
            probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        if self.top_p < 1:
            # SGLang's threshold (FlashInfer's): in ascending order, the first probability at which the
            # running mass reaches 1 - p is the pivot; every token at or above it stays, ties included
            probs = probs / probs.sum(-1, keepdim=True)
            ascending = probs.sort(dim=-1).values
            cut = torch.searchsorted(ascending.cumsum(-1), torch.full_like(ascending[..., :1], 1 - self.top_p))
            pivot = ascending.gather(-1, cut.clamp(max=ascending.shape[-1] - 1))
            probs = torch.where(probs >= pivot, probs, torch.zeros_like(probs))
        return probs / probs.sum(-1, keepdim=True)

    def generator(self, device: torch.device | str, key: str) -> torch.Generator:
        """Return a generator seeded from the seed and `key` (a prompt id): runs repeat, prompt by prompt."""
        return torch.Generator(device=device).manual_seed((self.seed << 32) ^ zlib.crc32(key.encode()))


def draw_per_node(logits: torch.Tensor, drafted: torch.Tensor, lengths: torch.Tensor, sampling: Sampling,
                   generator: torch.Generator) -> torch.Tensor:
    """Return [P, W+1]: the target's sampled token at every node of the verified paths.

    Position i of path p is the node reached by its first i drafted tokens; paths that share those
    tokens share the node, so it is drawn once for all of them (independent draws per path would let
    the best path pick among several samples and overstate acceptance). Positions past a path's end
    are left 0: the accepted prefix is capped at the path's length, so they are never read.
    """
    n_paths, width = logits.shape[0], logits.shape[1]
    rows, ends = drafted.tolist(), lengths.tolist()  # one device sync each
    nodes: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for p in range(n_paths):
        for i in range(int(ends[p]) + 1):
            nodes.setdefault(tuple(rows[p][:i]), []).append((p, i))
    where = list(nodes.values())
    first = torch.tensor([w[0] for w in where], device=logits.device)
    drawn = torch.multinomial(sampling.probs(logits[first[:, 0], first[:, 1]]), 1, generator=generator)[:, 0].tolist()
    choice = [[0] * width for _ in range(n_paths)]  # filled on the host, moved once
    for positions, token in zip(where, drawn):
        for p, i in positions:
            choice[p][i] = token
    return torch.tensor(choice, dtype=torch.long, device=logits.device)


