"""What proposes draft tokens to the verifier: the Proposer protocol every draft kind's proposer
implements (EAGLE-3's: training/eagle3/proposer.py)."""

from __future__ import annotations

from typing import Protocol

import torch


class Proposer(Protocol):
    """What proposes draft tokens. `aux_layer_ids` None: the proposer needs no target states."""

    aux_layer_ids: list[int] | None

    def begin(self, prompt_ids: list[int]) -> None:
        """Forget the previous sequence; a new one starts with these prompt tokens."""

    def propose(self, tokens: torch.Tensor, aux: torch.Tensor | None, steps: int, topk: int) -> list[list[int]]:
        """Return draft paths (target token ids, each `steps` long) continuing `tokens` [n].

        aux [n-1, 3*Ht] holds the target's aux states of every token but the last; a chain is
        one path, a tree with top-k several (at most `topk`)."""
