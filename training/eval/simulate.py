"""Acceptance length, simulated: what any draft kind's replay of decoding on stored hidden states
shares. Acceptance counted per verification forward (`AcceptanceStats`) and weighted by a traffic
profile; the draft tree SGLang grows (`DraftTree`, `TreeBuilder`) and its verification budget; the
walk over the cycle starts decoding visits in an answer (`answer_spans`, `walk_cycles`); the result
(`SimulatedAcceptance`). The EAGLE-3 replay itself is training/eagle3/simulate.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from training.errors import TrainingError
from training.feed.batches import SampleStore


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

    def accepted(self, keep: torch.Tensor, truth: torch.Tensor,
                 to_target: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Return [R] int64: the depth of the deepest kept node whose root path matches `truth`.

        truth [R, steps]: the target's tokens at depths 1..steps (-1 where unknown: never matched);
        `to_target` maps the tree's draft-vocabulary ids to target ids.
        """
        target_ids = to_target(self.tokens)  # [R, N]
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
