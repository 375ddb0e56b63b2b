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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from training.eagle3.model import Eagle3Draft, TTTCache
from training.errors import TrainingError
from training.feed.batches import SampleStore, load_batch


@dataclass
class AcceptanceStats:
    """Acceptance over many verification forwards: tokens per forward and rate per draft position."""

    steps: int
    accepted: list[int] = field(default_factory=list)

    def add(self, accepted: Iterable[int]) -> None:
        self.accepted.extend(accepted)

    @property
    def forwards(self) -> int:
        return len(self.accepted)

    @property
    def acceptance_length(self) -> float:
        """Return mean tokens per target forward (accepted draft tokens + the target's own)."""
        return 1.0 + sum(self.accepted) / self.forwards if self.accepted else float("nan")

    def histogram(self) -> list[int]:
        """Return the count of verification forwards that accepted 0, 1, ..., steps draft tokens."""
        counts = [0] * (self.steps + 1)
        for a in self.accepted:
            counts[a] += 1
        return counts

    @classmethod
    def from_histogram(cls, counts: Sequence[int]) -> AcceptanceStats:
        """Return the stats of a histogram (as `histogram` gives, e.g. summed over ranks)."""
        stats = cls(len(counts) - 1)
        for a, n in enumerate(counts):
            stats.accepted.extend([a] * int(n))
        return stats

    def position_rates(self) -> list[dict[str, float]]:
        """Return per draft position k: P(tokens 1..k accepted) and P(token k | tokens 1..k-1)."""
        rows = []
        reached = self.forwards
        for k in range(1, self.steps + 1):
            hits = sum(a >= k for a in self.accepted)
            rows.append({"position": k, "rate": hits / self.forwards if self.forwards else float("nan"),
                         "conditional": hits / reached if reached else float("nan")})
            reached = hits
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"forwards": self.forwards, "acceptance_length": self.acceptance_length,
                "per_position": self.position_rates()}


def traffic_weighted(categories: dict[str, AcceptanceStats], shares: dict[str, float],
                     groups: dict[str, str] | None = None) -> dict[str, Any]:
    """Return acceptance per traffic category and the traffic-weighted acceptance length.

    `shares` are the traffic's category shares (a traffic profile's, as a plain dict); `groups`
    maps the report's category names to traffic categories (a name it lacks stands for itself),
    so that e.g. "coding" and "debugging" prompts both count for "code". The weights are the shares
    renormalised over the traffic categories that have measured forwards: `missing` names those with
    a share but nothing measured, `unweighted` the report's categories that are no traffic category.
    """
    groups = groups or {}
    merged: dict[str, AcceptanceStats] = {}
    unweighted = []
    for name, stats in sorted(categories.items()):
        cat = groups.get(name, name)
        if cat not in shares:
            unweighted.append(name)
            continue
        merged.setdefault(cat, AcceptanceStats(stats.steps)).add(stats.accepted)
    present = {c: s for c, s in shares.items() if s > 0 and c in merged and merged[c].forwards}
    total = sum(present.values())
    per_category = {
        c: {"share": s, "weight": present[c] / total if c in present else 0.0,
            "forwards": merged[c].forwards if c in merged else 0,
            "acceptance_length": merged[c].acceptance_length if c in merged else float("nan")}
        for c, s in shares.items()
    }
    weighted = sum(present[c] / total * merged[c].acceptance_length for c in present) if total else float("nan")
    return {"acceptance_length": weighted, "categories": per_category,
            "missing": [c for c, s in shares.items() if s > 0 and c not in present], "unweighted": unweighted}


# -- the draft tree, as SGLang builds it --------------------------------------------------------


@dataclass
class DraftTree:
    """Candidate nodes of one draft round for R rows (cycle starts), in SGLang's score-list order.

    Node i: draft token `tokens[:, i]`, cumulative probability `scores[:, i]`, parent node
    `parents[:, i]` (-1: the root, i.e. the cycle's last token), depth `depth[i]` (1..steps).
    """

    tokens: torch.Tensor  # [R, N] draft-vocab ids
    scores: torch.Tensor  # [R, N] float32
    parents: torch.Tensor  # [R, N] int64
    depth: list[int]

    def selected(self, num_draft_tokens: int | None) -> torch.Tensor:
        """Return [R, N] bool: the nodes verified, the top num_draft_tokens-1 by score (None: all)."""
        R, N = self.scores.shape
        if num_draft_tokens is None or num_draft_tokens - 1 >= N:
            return torch.ones(R, N, dtype=torch.bool, device=self.scores.device)
        if num_draft_tokens < 2:
            raise TrainingError(f"num_draft_tokens {num_draft_tokens} leaves no draft token to verify")
        top = self.scores.topk(num_draft_tokens - 1, dim=-1).indices
        mask = torch.zeros(R, N, dtype=torch.bool, device=self.scores.device)
        return mask.scatter_(1, top, True)

    def reachable(self, keep: torch.Tensor) -> torch.Tensor:
        """Return [R, N] bool: nodes kept whose every ancestor is kept (what the verifier can reach)."""
        ok = keep.clone()
        depth = torch.tensor(self.depth, device=keep.device)
        for d in range(2, max(self.depth, default=1) + 1):  # a node's parent is one level up: final already
            level = (depth == d).nonzero().squeeze(1)  # [n_d]
            ok[:, level] &= ok.gather(1, self.parents[:, level])
        return ok

    def accepted(self, keep: torch.Tensor, truth: torch.Tensor, draft: Eagle3Draft) -> torch.Tensor:
        """Return [R] int64: the depth of the deepest kept node whose root path matches `truth`.

        truth [R, steps]: the target's tokens at depths 1..steps (-1 where unknown: never matched).
        """
        target_ids = draft.draft_to_target(self.tokens)  # [R, N]
        depth = torch.tensor(self.depth, device=truth.device)  # [N]
        want = truth.gather(1, (depth - 1).expand_as(target_ids))  # [R, N]
        hit = keep & (target_ids == want)
        path_ok = self.reachable(hit)
        return (path_ok.long() * depth).amax(dim=1) if path_ok.shape[1] else torch.zeros_like(truth[:, 0])

    def paths(self, keep: torch.Tensor, row: int = 0) -> list[list[int]]:
        """Return the root-to-leaf draft-token paths of the kept, reachable nodes of `row`."""
        ok = self.reachable(keep)[row].tolist()
        parents = self.parents[row].tolist()
        tokens = self.tokens[row].tolist()
        has_child = [False] * len(ok)
        for i, p in enumerate(parents):
            if ok[i] and p >= 0:
                has_child[p] = True
        out = []
        for i in range(len(ok)):
            if ok[i] and not has_child[i]:
                path, j = [], i
                while j >= 0:
                    path.append(tokens[j])
                    j = parents[j]
                out.append(path[::-1])
        return out


class TreeBuilder:
    """Grows a DraftTree step by step from the draft's logits, as SGLang's `select_top_k_tokens`.

    `first(logits [R, V])` starts topk beams; `extend(logits [R, topk, V])` scores the topk^2
    children of the beams, keeps the best topk as the next beams and returns, per new beam, the
    slot of its parent (whose hidden state the next step reads).
    """

    def __init__(self, topk: int) -> None:
        self.topk = topk
        self.tokens: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.parents: list[torch.Tensor] = []
        self.depth: list[int] = []
        self.beam_scores = torch.empty(0)
        self.beam_tokens = torch.empty(0)
        self.beam_nodes = torch.empty(0)
        self.level = 0  # depth of the newest candidates

    def first(self, logits: torch.Tensor) -> torch.Tensor:
        """Return [R, topk] draft ids of the first beams."""
        probs = logits.float().softmax(-1)
        scores, tokens = probs.topk(self.topk, dim=-1)  # [R, k]
        R = scores.shape[0]
        self.level = 1
        self._add(tokens, scores, torch.full_like(tokens, -1), self.level)
        self.beam_scores, self.beam_tokens = scores, tokens
        self.beam_nodes = torch.arange(self.topk, device=tokens.device).expand(R, -1)
        return tokens

    def extend(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ([R, topk] draft ids of the next beams, [R, topk] parent slot of each)."""
        k = self.topk
        probs = logits.float().softmax(-1)  # [R, k, V]
        child_p, child_tok = probs.topk(k, dim=-1)  # [R, k, k]
        expand = self.beam_scores[:, :, None] * child_p  # [R, k, k]
        R = expand.shape[0]
        base = sum(t.shape[1] for t in self.tokens)
        parents = self.beam_nodes[:, :, None].expand(R, k, k).reshape(R, k * k)
        self.level += 1
        self._add(child_tok.reshape(R, k * k), expand.reshape(R, k * k), parents, self.level)
        best_scores, best = expand.reshape(R, k * k).topk(k, dim=-1)  # [R, k]
        self.beam_scores = best_scores
        self.beam_tokens = child_tok.reshape(R, k * k).gather(1, best)
        self.beam_nodes = base + best
        return self.beam_tokens, best // k

    def _add(self, tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor, depth: int) -> None:
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.parents.append(parents)
        self.depth.extend([depth] * tokens.shape[1])

    def tree(self) -> DraftTree:
        """Return every candidate node so far."""
        return DraftTree(torch.cat(self.tokens, 1), torch.cat(self.scores, 1), torch.cat(self.parents, 1).long(),
                         list(self.depth))


def default_draft_tokens(steps: int, topk: int, num_draft_tokens: int | None) -> int | None:
    """Return the verification budget: as given, or steps+1 for a chain (SGLang's chain)."""
    if num_draft_tokens is not None:
        return num_draft_tokens
    return steps + 1 if topk == 1 else None


# -- simulation over stored samples -------------------------------------------------------------


class SampleSource(SampleStore, Protocol):
    """What the simulation reads: a HiddenStateStore, OnlineStates, or any object with these
    (load_batch's root and load_many, and each sample's category and length)."""

    def category(self, sid: str) -> str: ...

    def length(self, sid: str) -> int: ...


@dataclass
class SimulatedAcceptance:
    """The simulated decoding of held-out samples: acceptance overall and per category."""

    steps: int
    topk: int
    num_draft_tokens: int | None
    overall: AcceptanceStats
    categories: dict[str, AcceptanceStats]
    samples: int = 0
    tokens: int = 0  # stored tokens fed to the draft (prompts and answers): what the cost scales with
    answer_tokens: int = 0  # answer tokens the walk decided
    greedy_positions: int = 0  # answer positions checked against the target's argmax
    greedy_agree: int = 0
    seconds: float = 0.0

    @property
    def acceptance_length(self) -> float:
        return self.overall.acceptance_length

    @property
    def greedy_agreement(self) -> float | None:
        """Return the share of answer tokens equal to the target's argmax (None: not checked)."""
        return self.greedy_agree / self.greedy_positions if self.greedy_positions else None

    def seconds_per_1k_tokens(self) -> float:
        """Return the cost: seconds per 1,000 held-out tokens fed (prompt and answer positions)."""
        return 1000.0 * self.seconds / self.tokens if self.tokens else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "method": "simulated decoding (SGLang EAGLE-3 draft loop on stored target states)",
            "steps": self.steps, "topk": self.topk, "num_draft_tokens": self.num_draft_tokens,
            "samples": self.samples, "tokens": self.tokens, "answer_tokens": self.answer_tokens,
            "acceptance_length": self.acceptance_length, "overall": self.overall.to_json(),
            "categories": {c: s.to_json() for c, s in sorted(self.categories.items())},
            "greedy_agreement": self.greedy_agreement,
            "seconds": self.seconds, "seconds_per_1k_tokens": self.seconds_per_1k_tokens(),
        }


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
    return tree.accepted(keep, truth.reshape(B * T, steps), draft).reshape(B, T)


def answer_spans(loss_mask: Sequence[bool]) -> list[tuple[int, int]]:
    """Return the (first, last) positions of each run of loss-masked tokens: one answer each."""
    spans, start = [], None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i - 1))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask) - 1))
    return spans


def walk_cycles(accepted: Sequence[int], spans: Sequence[tuple[int, int]], max_new_tokens: int | None = None) -> tuple[list[int], int]:
    """Return (accepted per visited cycle, answer tokens decided) of decoding each span.

    accepted[t]: what a cycle with draft origin t accepts. A span's first token comes from the
    prefill (no draft); each cycle then starts at n, drafts from origin n-2, and moves n on by
    a+1, until the span (or `max_new_tokens` new tokens) is decided.
    """
    visited, decided = [], 0
    for first, last in spans:
        if first < 1:
            continue  # an answer with no prompt before it: nothing for the draft to start from
        n = first + 1
        while n <= last and (max_new_tokens is None or n - first < max_new_tokens):
            a = int(accepted[n - 2])
            visited.append(a)
            n += a + 1
        decided += min(n, last + 1) - first
    return visited, decided


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
