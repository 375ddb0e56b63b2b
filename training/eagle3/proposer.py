"""The EAGLE-3 draft as the proposer speculative decoding asks for draft tokens (training.eval.decode)."""

from __future__ import annotations

import torch

from training.eagle3.model import Eagle3Draft, KVCache
from training.errors import ModelMismatchError, TrainingError
from training.eval.simulate import TreeBuilder, default_draft_tokens


class DraftProposer:
    """The EAGLE-3 draft as a proposer, with its own KV cache kept across rounds.

    The cache holds only positions fed with real target states; each round's drafted positions
    are cropped away at the start of the next, once verification has said which tokens stand.
    A tree (topk > 1) is grown as SGLang grows it (training.eval.simulate.TreeBuilder): beams of topk,
    each slot attending to the real prefix and its own slot's earlier keys, and the top
    `num_draft_tokens`-1 nodes by cumulative probability verified (None: steps+1 for a chain,
    every candidate for a tree).
    """

    def __init__(self, draft: Eagle3Draft, num_draft_tokens: int | None = None) -> None:
        self.draft = draft.eval()
        self.num_draft_tokens = num_draft_tokens
        self.aux_layer_ids: list[int] | None = list(draft.config.aux_layer_ids)
        if len(self.aux_layer_ids) != draft.config.num_aux_layers:
            raise ModelMismatchError(
                f"the draft records aux layer ids {self.aux_layer_ids} but fuses {draft.config.num_aux_layers} layers"
            )
        self.cache = KVCache()
        self.n_real = 0  # draft positions whose target states were real (not the draft's own)

    def begin(self, prompt_ids: list[int]) -> None:
        self.cache = KVCache()
        self.n_real = 0

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, aux: torch.Tensor | None, steps: int, topk: int) -> list[list[int]]:
        if aux is None:
            raise TrainingError("the EAGLE-3 draft needs the target's aux states")
        device = next(self.draft.parameters()).device
        dtype = self.draft.fc.weight.dtype
        n = tokens.shape[0]
        self.cache.crop(self.n_real)
        # pairs (token j+1, aux j) at draft position j, for every position not fed yet
        ids = tokens[self.n_real + 1 : n].to(device)[None]  # (1, T)
        hidden = aux[self.n_real : n - 1].to(device=device, dtype=dtype)[None]  # (1, T, 3Ht)
        out = self.draft(ids, hidden, cache=self.cache)
        self.n_real = n - 1
        builder = TreeBuilder(topk)
        beams = builder.first(out.logits[:, -1])[0]  # (k,) draft ids
        hidden = out.hidden[:, -1:].expand(topk, 1, -1)  # (k, 1, H)
        cache = self._batched(topk)
        for _ in range(steps - 1):
            step = self.draft(self.draft.draft_to_target(beams)[:, None], hidden, cache=cache)
            beams, parent_slot = builder.extend(step.logits[:, -1][None])  # (1, k) each
            beams, parent_slot = beams[0], parent_slot[0]
            hidden = step.hidden[parent_slot, -1:]  # (k, 1, H): each new beam reads its parent's state
            # the keys stay with their slot, as in SGLang's draft decode (not reordered by parent)
        tree = builder.tree()
        budget = default_draft_tokens(steps, topk, self.num_draft_tokens)
        paths = tree.paths(tree.selected(budget))
        to_target = self.draft.draft_to_target
        return [to_target(torch.tensor(p, device=device)).tolist() for p in paths]

    def _batched(self, n_paths: int) -> KVCache:
        """Return the cache for drafting: this one for a chain, a per-slot copy for a tree."""
        if n_paths == 1:
            return self.cache
        tree = KVCache()
        tree.k = self.cache.k.repeat(n_paths, 1, 1, 1)  # type: ignore[union-attr]
        tree.v = self.cache.v.repeat(n_paths, 1, 1, 1)  # type: ignore[union-attr]
        return tree
