"""The EAGLE-3 training objective (training-time test) and its metrics.

Per micro-batch, the target's logits come from the stored final hidden state and the target's
lm_head: their argmax says which positions the draft can match at all (in the draft vocab), and
their softmax restricted to the draft vocab is what the draft learns. TTT: step 0 feeds the
target's fused aux states; step k feeds the draft's own hidden output of step k-1 and the input
ids shifted by k, at positions t+k (see draft.TTTCache for attention). The loss is
sum_k 0.8^k * soft-CE(target_p, draft) over loss-masked positions whose target argmax lies in the
draft vocab, divided by the count of loss-masked positions of step k over the whole global batch
(known from the masks alone, so every rank divides by the same number and N ranks add up to
exactly the 1-rank gradient).

Two implementations of the same objective: TTTObjective over padded batches [B, T] (the
reference, with draft.TTTCache), and PackedTTTObjective over packed rows of whole samples
(training.feed.packing), which the trainer runs; tests/training/train/test_train_equivalence.py holds them equal.
For long rows PackedTTTObjective recomputes the first TTT steps in the backward instead of keeping
their activations (`recompute`; by default as many as the free device memory calls for).

Metrics per TTT step k, over loss-masked positions (a target token outside the draft vocab counts
as a miss): acc_k (unconditional top-1 agreement), cond_acc_k (agreement given steps < k all
agreed at the same origin), and the teacher-forced acceptance estimate 1 + sum_k prod_{j<=k} cond_acc_j.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from training.feed.batches import Batch, States
from training.runtime.distributed import all_reduce_sum
from training.eagle3 import kernels
from training.eagle3.model import Eagle3Draft, TTTCache
from training.runtime.profiling import phase
from training.feed.packing import PackedBatch, pack_samples, plan_micro_batches, step_valid
from training.eagle3.soft_ce import soft_cross_entropy_sum
from training.target.head import TargetHead
from training.eagle3.ttt_attention import PackedTTTCache

# per TTT step: loss_sum, n_valid, n_correct, n_prefix (all right through k), n_prev (all right through k-1),
# and the target's entropy summed over the trained positions (loss - entropy is the KL the draft can still remove)
N_SUMS = 6

# PackedTTTObjective(recompute=None) keeps as many TTT steps' activations as fit in this share of
# the device memory still free, and recomputes the others (the rest is the recomputed step's own
# activations in the backward, gradients and temporaries).
RECOMPUTE_ABOVE = 0.5


def step_activation_bytes(cfg: Any, element_bytes: int = 2) -> int:
    """Return an estimate of the bytes one token's TTT step keeps for the backward (bf16 autocast).

    Counted from the layer: its norms' inputs and outputs, the 2H-wide concat, q/k/v and the
    attention output, the SwiGLU's four intermediate-wide tensors, the final norm, and the soft
    cross-entropy's gradient over the draft vocabulary, plus float32 norm statistics and rounding
    (12 H-wide tensors in all). The H200 run of issue 39 measured 414 KB a token a step at the
    Kimi shape (hidden 7168, intermediate 18432, draft vocab 32000), this gives 387 KB: it only
    decides how many steps to recompute.
    """
    H, hd = int(cfg.hidden_size), int(cfg.head_dim)
    kv = 2 * int(cfg.num_key_value_heads) * hd
    return element_bytes * (12 * H + kv + 4 * int(cfg.intermediate_size) + int(cfg.draft_vocab_size))


@dataclass
class TargetSignals:
    argmax: torch.Tensor  # [B, T] the target's greedy token at each position
    probs: torch.Tensor  # [B, T, draft_vocab] float32, softmax over the draft vocab's logits
    valid: torch.Tensor  # [B, T] bool: the token after this position is loss-masked
    in_vocab: torch.Tensor  # [B, T] bool: the target's argmax has a draft id
    entropy: torch.Tensor | None = None  # [B, T] float32: entropy of probs (packed_target_signals only)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (argmax, probs, valid, in_vocab), the order TTTObjective takes them in."""
        return self.argmax, self.probs, self.valid, self.in_vocab


def valid_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Return [B, T] bool: the target's prediction at p counts when token p+1 is in the loss mask."""
    valid = torch.zeros_like(loss_mask)
    valid[:, :-1] = loss_mask[:, 1:]
    return valid


@torch.no_grad()
def target_signals(batch: Batch, head: TargetHead, draft_ids: torch.Tensor, t2d: torch.Tensor) -> TargetSignals:
    """Return the target's argmax, its draft-vocab distribution and the masks for `batch`."""
    argmax, probs = [], []
    for row in batch.final:  # one sequence at a time bounds the [T, V] logits
        logits = head(row)  # (T, V)
        argmax.append(logits.argmax(-1))
        probs.append(logits[:, draft_ids].float().softmax(-1))  # (T, draft_vocab)
    am = torch.stack(argmax)
    return TargetSignals(am, torch.stack(probs), valid_positions(batch.loss_mask), t2d[am])


@torch.no_grad()
def packed_target_signals(
    batch: PackedBatch, head: TargetHead, draft_ids: torch.Tensor, t2d: torch.Tensor, rows: int = 4096
) -> TargetSignals:
    """Return target_signals' fields for a packed row [1, N], plus each position's entropy.

    The head runs over `rows` positions at a time (bounding the [rows, V] logits); the entropy is
    computed once here rather than once per TTT step.
    """
    final = batch.final[0]
    argmax, probs, entropy = [], [], []
    for s in range(0, final.shape[0], rows):
        logits = head(final[s : s + rows])  # (rows, V)
        if kernels.fused_enabled(logits):  # the same three, compiled into one pass over the logits
            am, p, ent = kernels.target_rows(logits, draft_ids)
            argmax.append(am)
            probs.append(p)
            entropy.append(ent)
            continue
        argmax.append(logits.argmax(-1))
        p = logits[:, draft_ids].float().softmax(-1)  # (rows, draft_vocab)
        probs.append(p)
        entropy.append(-(p * p.clamp(min=1e-30).log()).sum(-1))
    am = torch.cat(argmax)[None]
    return TargetSignals(am, torch.cat(probs)[None], batch.valid(), t2d[am], torch.cat(entropy)[None])


class TTTObjective(nn.Module):
    """The whole TTT unroll as one module call, so DDP sees one forward per backward."""

    def __init__(self, draft: Eagle3Draft) -> None:
        super().__init__()
        self.draft = draft

    def forward(
        self,
        input_ids: torch.Tensor,
        aux: torch.Tensor,
        target_argmax: torch.Tensor,
        target_probs: torch.Tensor,
        valid_mask: torch.Tensor,
        in_vocab: torch.Tensor,
        step_scale: torch.Tensor,
        ttt_steps: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (loss = sum_k step_scale[k] * loss_sum_k, metric sums [ttt_steps, N_SUMS]).

        Takes the TargetSignals fields as plain tensors so DDP can handle the inputs.
        """
        draft = self.draft
        B, T = input_ids.shape
        sums = torch.zeros(ttt_steps, N_SUMS, dtype=torch.float64, device=input_ids.device)
        loss = aux.new_zeros((), dtype=torch.float32)
        cache, hidden = TTTCache(), aux
        positions = torch.arange(T, device=input_ids.device).expand(B, T)
        prefix = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)  # all right so far, per origin
        for k in range(ttt_steps):
            n = T - 1 - k  # origins t whose step-k target position t+1+k exists
            if n <= 0:
                break
            step_ids = F.pad(input_ids[:, k + 1 :], (0, k + 1))  # token x_{t+1+k} at origin t
            with phase(f"draft_step{k}"):
                out = draft(step_ids, hidden, position_ids=positions + k, cache=cache)
            hidden = out.hidden  # (B, T, H): the next step's input
            with phase("loss"):
                logits = out.logits[:, :n].float()  # (B, n, draft_vocab)
                valid = valid_mask[:, 1 + k :]  # (B, n)
                train_mask = valid & in_vocab[:, 1 + k :]
                soft_ce = -(target_probs[:, 1 + k :] * F.log_softmax(logits, dim=-1)).sum(-1)  # (B, n)
                loss_sum = (soft_ce * train_mask).sum()
                loss = loss + step_scale[k] * loss_sum
                with torch.no_grad():
                    p = target_probs[:, 1 + k :]
                    entropy_sum = ((-(p * p.clamp(min=1e-30).log()).sum(-1)) * train_mask).sum()
                    correct = (draft.draft_to_target(logits.argmax(-1)) == target_argmax[:, 1 + k :]) & valid
                    prev = prefix[:, :n]
                    prefix = prev & correct
                    counted = [valid.sum(), correct.sum(), prefix.sum(), (prev & valid).sum()]
                    sums[k] = torch.stack([loss_sum.detach().double(), *(c.double() for c in counted),
                                           entropy_sum.double()])
        return loss, sums


class PackedTTTObjective(nn.Module):
    """TTTObjective over a packed row [1, N] of whole samples: the same loss, gradients and metric sums.

    What makes it fast (see bench/RESULTS.md): attention as flash attention per sample plus the
    TTT diagonals merged exactly (training.eagle3.ttt_attention), the soft cross-entropy with its gradient
    made in the forward (training.eagle3.soft_ce), the target's entropy once per batch, no padding, and
    no host synchronisation. Origin t at step k trains only when position t+1+k is in t's sample.
    """

    def __init__(self, draft: Eagle3Draft, recompute: bool | int | None = None) -> None:
        super().__init__()
        self.draft = draft
        # recompute: keep only a TTT step's inputs and recompute its activations in the backward
        # (long rows: the unroll's saved activations grow as tokens x TTT steps; see `recomputed_steps`).
        # True: every step but the last; an int: that many (the first ones); None: as many as the
        # row needs to fit in the device memory still free.
        self.recompute = recompute

    def recomputed_steps(self, tokens: int, ttt_steps: int, device: torch.device) -> int:
        """Return how many of a row's first TTT steps are recomputed in the backward (0: none).

        The last step is never recomputed: its backward runs first, so dropping its activations
        lowers no peak.
        """
        most = max(0, ttt_steps - 1)
        if not torch.is_grad_enabled() or self.recompute is False:
            return 0
        if self.recompute is True:
            return most
        if self.recompute is not None:
            return max(0, min(int(self.recompute), most))
        if device.type != "cuda":
            return 0
        free, _ = torch.cuda.mem_get_info(device)
        spare = free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        per_step = tokens * step_activation_bytes(self.draft.config)
        kept = int(RECOMPUTE_ABOVE * spare // max(per_step, 1))
        return max(0, min(ttt_steps - kept, most))

    def forward(
        self,
        input_ids: torch.Tensor,
        aux: torch.Tensor,
        target_argmax: torch.Tensor,
        target_probs: torch.Tensor,
        valid_mask: torch.Tensor,
        in_vocab: torch.Tensor,
        entropy: torch.Tensor,
        step_scale: torch.Tensor,
        positions: torch.Tensor,
        doc_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        bounds: list[int],
        ttt_steps: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (loss = sum_k step_scale[k] * loss_sum_k, metric sums [ttt_steps, N_SUMS]), as TTTObjective."""
        N = input_ids.shape[1]
        ids, doc, valid, in_voc = input_ids[0], doc_ids[0], valid_mask[0], in_vocab[0]
        probs, argmax, ent = target_probs[0], target_argmax[0], entropy[0]
        sums = torch.zeros(ttt_steps, N_SUMS, dtype=torch.float64, device=input_ids.device)
        loss = aux.new_zeros((), dtype=torch.float32)
        max_len = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
        cache, hidden = PackedTTTCache(cu_seqlens, bounds, max_len), aux
        prefix = torch.ones(N, dtype=torch.bool, device=input_ids.device)  # all right so far, per origin
        recompute = self.recomputed_steps(N, min(ttt_steps, N - 1), input_ids.device)
        for k in range(ttt_steps):
            n = N - 1 - k  # origins t whose step-k target position t+1+k exists in the row
            if n <= 0:
                break
            args = (hidden, prefix, k, ids, positions, cache, probs, argmax, ent, valid, in_voc, doc, step_scale)
            if k < recompute:
                hidden, scaled, step_sums, prefix, keys = checkpoint(self._step, *args, use_reentrant=False,
                                                                     preserve_rng_state=False)
            else:
                hidden, scaled, step_sums, prefix, keys = self._step(*args)
            cache.keep(*keys)
            loss = loss + scaled
            sums[k] = step_sums
        return loss, sums

    def _step(
        self, hidden: torch.Tensor, prefix: torch.Tensor, k: int, ids: torch.Tensor, positions: torch.Tensor,
        cache: PackedTTTCache, probs: torch.Tensor, argmax: torch.Tensor, ent: torch.Tensor, valid: torch.Tensor,
        in_voc: torch.Tensor, doc: torch.Tensor, step_scale: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Return TTT step k: (its hidden output, scaled loss, metric sums, all-right mask, its keys and values).

        A function of its arguments alone (the cache is read through the view of steps < k), so a
        checkpoint can run it again in the backward and get the same tensors.
        """
        n = ids.shape[0] - 1 - k
        view = cache.upto(k)
        step_ids = F.pad(ids[k + 1 :], (0, k + 1))[None]  # token x_{t+1+k} at origin t
        with phase(f"draft_step{k}"):
            out = self.draft(step_ids, hidden, position_ids=positions + k, cache=view)
        with phase("loss"):
            scaled, step_sums, prefix = self._step_loss(out.logits[0, :n], k, prefix, probs, argmax, ent,
                                                        valid, in_voc, doc, step_scale)
        return out.hidden, scaled, step_sums, prefix, view.newest()

    def _step_loss(
        self, logits: torch.Tensor, k: int, prefix: torch.Tensor, probs: torch.Tensor,
        argmax: torch.Tensor, ent: torch.Tensor, valid: torch.Tensor, in_voc: torch.Tensor, doc: torch.Tensor,
        step_scale: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (step k's scaled loss term, its metric sums [N_SUMS], the all-right-so-far mask)."""
        n = logits.shape[0]  # (n, draft_vocab), the autocast dtype
        step_ok = step_valid(valid, doc, k)  # (n,): same sample, loss token
        train_mask = step_ok & in_voc[1 + k :]
        scaled, loss_sum = soft_cross_entropy_sum(logits, probs[1 + k :], train_mask, step_scale[k])
        with torch.no_grad():
            entropy_sum = (ent[1 + k :] * train_mask).sum()
            correct = (self.draft.draft_to_target(logits.argmax(-1)) == argmax[1 + k :]) & step_ok
            prev = prefix[:n]
            prefix = prev & correct
            counted = [step_ok.sum(), correct.sum(), prefix.sum(), (prev & step_ok).sum()]
            sums = torch.stack([loss_sum.detach().double(), *(c.double() for c in counted),
                                entropy_sum.double()])
        return scaled, sums, prefix


def packed_call(
    objective: nn.Module, batch: PackedBatch, sig: TargetSignals, step_scale: torch.Tensor, ttt_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `objective(...)` (a PackedTTTObjective, or DDP around one) on a packed batch on the device."""
    return objective(batch.input_ids, batch.aux, *sig.tensors(), sig.entropy, step_scale, batch.positions,
                     batch.doc_ids, batch.cu_seqlens, batch.bounds, ttt_steps)


def step_counts(loss_mask: torch.Tensor, ttt_steps: int) -> torch.Tensor:
    """Return float64 [ttt_steps]: the loss-masked positions of each TTT step in a micro-batch."""
    valid = valid_positions(loss_mask)
    return torch.stack([valid[:, 1 + k :].sum() for k in range(ttt_steps)]).double()


def summarize(sums: torch.Tensor, step_weight: float = 0.8) -> dict[str, Any]:
    """Return loss, loss_k, target_entropy, kl, acc, cond_acc and accept_length from metric sums [ttt_steps, N_SUMS].

    `loss` is the soft cross-entropy against the target's distribution, so it never falls below
    the target's own entropy; `kl` = loss - target_entropy is the part the draft can still remove.
    """
    s = sums.double().cpu()
    n_valid = s[:, 1].clamp(min=1)
    loss_k = (s[:, 0] / n_valid).tolist()
    entropy_k = (s[:, 5] / n_valid).tolist() if s.shape[1] > 5 else [0.0] * len(loss_k)
    entropy = sum(step_weight**k * e for k, e in enumerate(entropy_k))
    acc = (s[:, 2] / n_valid).tolist()
    cond = (s[:, 3] / s[:, 4].clamp(min=1)).tolist()
    accept, run = 1.0, 1.0
    for c in cond:
        run *= c
        accept += run
    loss = sum(step_weight**k * lk for k, lk in enumerate(loss_k))
    return {
        "loss": loss,
        "loss_k": loss_k,
        "target_entropy": entropy,
        "kl": loss - entropy,
        "acc": acc,
        "cond_acc": cond,
        "accept_length": accept,
        "positions": int(s[0, 1]),
    }


@torch.no_grad()
def metric_sums(
    draft: Eagle3Draft,
    store: States,
    ids: Sequence[str],
    ttt_steps: int,
    head: TargetHead,
    *,
    batch_size: int = 4,
    max_length: int = 2048,
    autocast: bool = False,
) -> torch.Tensor:
    """Return the metric sums [ttt_steps, N_SUMS] of `draft` over the samples `ids` (this rank only)."""
    device = next(draft.parameters()).device
    dtype = torch.bfloat16 if autocast else torch.float32
    objective = PackedTTTObjective(draft)
    total = torch.zeros(ttt_steps, N_SUMS, dtype=torch.float64, device=device)
    scale = torch.zeros(ttt_steps, device=device)
    was_training = draft.training
    draft.eval()
    lengths = {sid: min(store.length(sid), max_length) for sid in ids}
    # packed, no padding: as many tokens per forward as `batch_size` padded samples could hold
    for group in plan_micro_batches(list(ids), lengths, batch_size * max_length):
        batch = pack_samples(store, group, max_length).to(device, dtype)
        sig = packed_target_signals(batch, head, draft.draft_ids(), draft.t2d)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            _, sums = packed_call(objective, batch, sig, scale, ttt_steps)
        total += sums
    draft.train(was_training)
    return total


def offline_metrics(
    draft: Eagle3Draft,
    store: States,
    ids: Sequence[str],
    ttt_steps: int,
    target_head: TargetHead,
    *,
    batch_size: int = 4,
    max_length: int = 2048,
    step_weight: float = 0.8,
) -> dict[str, Any]:
    """Return acc (per TTT step), cond_acc, accept_length, loss and positions of `draft` on `ids`.

    Teacher-forced on stored states, as in training: step k drafts the token k+1 ahead from the
    draft's own earlier hidden states. Summed over ranks when run under torchrun.
    """
    autocast = next(draft.parameters()).device.type == "cuda"
    sums = metric_sums(draft, store, ids, ttt_steps, target_head, batch_size=batch_size, max_length=max_length,
                       autocast=autocast)
    return summarize(all_reduce_sum(sums), step_weight)
