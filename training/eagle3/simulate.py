"""Acceptance length, simulated: speculative decoding replayed cycle by cycle on stored hidden states.

The teacher-forced estimate (acc_k averaged over every position) overstates acceptance because a
decoding cycle never starts at an average position: it starts right after the target corrected the
draft, where the next token is harder. This module replays decoding as SGLang runs EAGLE-3 over a
stored continuation of the target (input_ids, loss_mask, aux states):

    cycle at n (tokens x_0..x_{n-1} decided; x_{n-1} the previous cycle's bonus token):
      draft step 0:  (x_{n-1}, target aux_{n-2}) at draft position n-2, with the draft's KV of every
                     earlier position fed the target's own states  -> top-k of the first token
      draft step i:  the draft's own token and hidden state of step i-1, position n-2+i; a branch
                     attends to the real prefix plus the keys of its own slot at earlier steps
                     (SGLang's draft decode KV layout, `generate_draft_decode_kv_indices`)
      tree:          scores are products of draft probabilities; the top num_draft_tokens-1 nodes of
                     the topk + (steps-1)*topk^2 candidates are verified (`organize_draft_results`)
      verify:        accept the longest root path whose tokens equal x_n, x_{n+1}, ... ; a = its length
      next cycle:    n + a + 1 (the accepted tokens plus the target's bonus token)

Every cycle's draft work depends only on its start, so step 0 runs once over whole sequences
(causal attention), and steps 1..K-1 run for every possible start at once, each start attending to
its own prefix and its own drafted keys (training.eagle3.model.TTTCache, the TTT layout): K draft forwards
per batch, then a cheap walk over the cycle starts decoding actually visits.

The continuation's tokens are the target's choices: for a greedy continuation that is exactly what
greedy verification compares against. `greedy_agreement` (with the target head) says how often the
stored next token is the target's argmax; well under 1 means a sampled continuation, whose estimate
is the acceptance of a draft judged against the tokens the target sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from training.eagle3.model import Eagle3Draft, TTTCache
from training.errors import TrainingError
from training.eval.simulate import (
    AcceptanceStats,
    SampleSource,
    SimulatedAcceptance,
    TreeBuilder,
    answer_spans,
    default_draft_tokens,
    walk_cycles,
)
from training.feed.batches import load_batch


@torch.no_grad()
def cycle_acceptance(
    draft: Eagle3Draft,
    input_ids: torch.Tensor,
    aux: torch.Tensor,
    valid_truth: torch.Tensor,
    steps: int,
    topk: int = 1,
    num_draft_tokens: int | None = None,
) -> torch.Tensor:
    """Return [B, T] int64: draft tokens accepted by a cycle whose draft origin is position t.

    A cycle at origin t has decided x_0..x_{t+1} and drafts x_{t+2}..x_{t+1+steps}. input_ids
    [B, T] and aux [B, T, 3*Ht] as stored; valid_truth [B, T] bool says which tokens are the
    target's to compare against (the answer span; False stops a match).
    """
    if steps < 1 or topk < 1:
        raise TrainingError(f"steps ({steps}) and topk ({topk}) must be at least 1")
    B, T = input_ids.shape
    device = input_ids.device
    # truth[b, t, d-1] = x_{t+1+d} for depth d, or -1 where not the target's to judge
    padded = torch.where(valid_truth, input_ids, torch.full_like(input_ids, -1))
    padded = F.pad(padded, (0, steps + 1), value=-1)
    truth = torch.stack([padded[:, 1 + d : 1 + d + T] for d in range(1, steps + 1)], dim=-1)  # [B, T, K]

    positions = torch.arange(T, device=device).expand(B, T)
    cache = TTTCache()
    step_ids = F.pad(input_ids[:, 1:], (0, 1))  # token x_{t+1} at draft position t
    out = draft(step_ids, aux, position_ids=positions, cache=cache)  # step 0: the target's states
    builder = TreeBuilder(topk)
    beams = builder.first(out.logits.reshape(B * T, -1)).reshape(B, T, topk)
    hidden = out.hidden  # [B, T, H]
    if steps > 1 and topk > 1:
        # one row per (sample, slot): every slot sees the same real prefix
        cache.keys[0] = cache.keys[0].repeat_interleave(topk, dim=0)
        cache.values[0] = cache.values[0].repeat_interleave(topk, dim=0)
        hidden = hidden.repeat_interleave(topk, dim=0)  # [B*k, T, H]
    for i in range(1, steps):
        ids = draft.draft_to_target(beams).permute(0, 2, 1).reshape(B * topk, T)  # [B*k, T]
        out = draft(ids, hidden, position_ids=(positions + i).repeat_interleave(topk, dim=0), cache=cache)
        logits = out.logits.reshape(B, topk, T, -1).permute(0, 2, 1, 3).reshape(B * T, topk, -1)
        tokens, parent_slot = builder.extend(logits)  # [B*T, k] each
        beams = tokens.reshape(B, T, topk)
        # the next step reads each new beam's parent hidden state; the KV stays per slot (as SGLang)
        h = out.hidden.reshape(B, topk, T, -1)
        pick = parent_slot.reshape(B, T, topk).permute(0, 2, 1)  # [B, k, T]
        hidden = h.gather(1, pick[..., None].expand(-1, -1, -1, h.shape[-1])).reshape(B * topk, T, -1)
    tree = builder.tree()
    keep = tree.selected(num_draft_tokens)
    return tree.accepted(keep, truth.reshape(B * T, steps), draft.draft_to_target).reshape(B, T)


@torch.no_grad()
def simulate_acceptance(
    draft: Eagle3Draft,
    store: SampleSource,
    ids: Sequence[str],
    *,
    steps: int,
    topk: int = 1,
    num_draft_tokens: int | None = None,
    target_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    batch_size: int = 4,
    max_length: int = 2048,
    max_new_tokens: int | None = None,
    autocast: bool = False,
) -> SimulatedAcceptance:
    """Return the simulated acceptance of `draft` decoding the stored samples `ids` (see module doc).

    num_draft_tokens: the engine's verification budget (default: steps+1 for a chain, every
    candidate for a tree). target_head, when given, checks that the continuation is greedy.
    """
    budget = default_draft_tokens(steps, topk, num_draft_tokens)
    device = next(draft.parameters()).device
    dtype = torch.bfloat16 if autocast else torch.float32
    result = SimulatedAcceptance(steps, topk, budget, AcceptanceStats(steps), {})
    was_training = draft.training
    draft.eval()
    start = time.perf_counter()
    ordered = sorted(ids, key=store.length)  # similar lengths together: less padding
    try:
        for i in range(0, len(ordered), batch_size):
            chunk = ordered[i : i + batch_size]
            batch = load_batch(store, chunk, max_length).to(device, dtype)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                accepted = cycle_acceptance(draft, batch.input_ids, batch.aux, batch.loss_mask, steps, topk, budget)
            masks = batch.loss_mask.cpu()
            accepted = accepted.cpu()
            for row, sid in enumerate(chunk):
                spans = answer_spans(masks[row].tolist())
                visited, decided = walk_cycles(accepted[row].tolist(), spans, max_new_tokens)
                result.overall.add(visited)
                result.categories.setdefault(store.category(sid) or "all", AcceptanceStats(steps)).add(visited)
                result.answer_tokens += decided
            if target_head is not None:
                _check_greedy(result, batch, target_head)
            result.samples += len(chunk)
            result.tokens += sum(min(store.length(sid), max_length) for sid in chunk)
    finally:
        draft.train(was_training)
    result.seconds = time.perf_counter() - start
    return result


def _check_greedy(result: SimulatedAcceptance, batch: Any, target_head: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Count answer tokens that are the target's argmax at the position before them."""
    for row in range(batch.input_ids.shape[0]):
        mask = batch.loss_mask[row, 1:]  # position p predicts token p+1
        if not mask.any():
            continue
        argmax = target_head(batch.final[row, :-1][mask]).argmax(-1)  # one sequence at a time bounds [T, V]
        result.greedy_positions += int(mask.sum())
        result.greedy_agree += int((argmax == batch.input_ids[row, 1:][mask]).sum())


def simulated_eval(
    draft: Eagle3Draft,
    store: SampleSource,
    ids: Sequence[str],
    steps: int,
    *,
    rank: int = 0,
    world: int = 1,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    batch_size: int = 4,
    max_length: int = 2048,
    autocast: bool = False,
) -> dict[str, Any]:
    """Return the trainer's eval fields for a chain of `steps`: sim_accept_length, sim_per_position
    and sim_categories, over all ranks (each simulates ids[rank::world]; `reduce` sums across them)."""
    names = sorted({store.category(sid) or "all" for sid in ids})
    local = simulate_acceptance(draft, store, list(ids)[rank::world], steps=steps, batch_size=batch_size,
                                max_length=max_length, autocast=autocast)
    device = next(draft.parameters()).device
    counts = torch.zeros(len(names), steps + 1, dtype=torch.float64, device=device)
    for i, name in enumerate(names):
        if name in local.categories:
            counts[i] = torch.tensor(local.categories[name].histogram(), dtype=torch.float64)
    if reduce is not None:
        counts = reduce(counts)
    per_category = {n: AcceptanceStats.from_histogram([int(c) for c in row.tolist()]) for n, row in zip(names, counts)}
    overall = AcceptanceStats.from_histogram([int(c) for c in counts.sum(0).tolist()])
    return {
        "sim_accept_length": overall.acceptance_length,
        "sim_steps": overall.steps,  # the chain's length K: the figure is at most K + 1
        "sim_per_position": [r["rate"] for r in overall.position_rates()],
        "sim_categories": {n: s.acceptance_length for n, s in per_category.items() if s.forwards},
    }
