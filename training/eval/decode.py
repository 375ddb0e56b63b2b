"""Acceptance length, measured: speculative decoding with the target (transformers, KV cache) and a
draft, checked token for token against plain greedy decoding of the target.

One round, with `tokens` the sequence so far (its last token produced by the target and not yet
fed to it) and the target's KV cache holding every token before that one:

    draft:   propose K tokens d1..dK (a chain; with top-k, several root-to-leaf paths of a tree)
    target:  one forward over [last, d1..dK]  ->  its argmax g0..gK at each of the K+1 positions
    accept:  the longest prefix with d_i == g_{i-1}, plus the target's own next token g_a
    cache:   cropped to the accepted length (DynamicCache.crop); aux states of accepted positions kept

so every round costs one target forward and yields a+1 tokens: the acceptance length is their mean.
A tree is verified as a batch of its paths (cache repeated per path), still one target forward.

Sampled verification (`Sampling`, temperature > 0) is SGLang's target-only tree speculative
sampling with its default thresholds (1.0): at a node, the children are tried in order against one
coin and child c is accepted with probability p(c); when all are rejected the bonus token is drawn
from p without them. Drawing one token x ~ p per node and accepting the child equal to x has exactly
that law, so that is how it runs here: `argmax` becomes one draw per tree node. The output is then a
sample of the target at that temperature (the check against greedy decoding does not apply), and a
simulation on the sampled output's own states replays its cycles exactly (tests/training/eval/test_sampled_eval.py).

The draft's pairing follows EAGLE-3 training: the target's aux states at position j go with token
j+1 (the token the target chose after seeing j), at draft position j, and predict token j+2. Aux
states are the target's `hidden_states[L]` for each layer id L (SGLang convention: input of layer L).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from training.errors import ModelMismatchError, TrainingError
from training.eval.proposers import Proposer
from training.eval.sampling import Sampling, draw_per_node


class GreedyMismatchError(TrainingError):
    """Speculative decoding produced other tokens than greedy decoding of the target: a bug."""


@dataclass
class SpecResult:
    """One prompt decoded speculatively: the new tokens and what each verification accepted."""

    tokens: list[int]
    accepted: list[int]  # draft tokens accepted per target verification forward
    draft_s: float = 0.0
    target_s: float = 0.0


@dataclass
class GreedyResult:
    """One prompt decoded greedily; margins[i] = top-1 minus top-2 logit when token i was chosen."""

    tokens: list[int]
    margins: list[float]
    seconds: float = 0.0


def _finish(tokens: list[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Return tokens cut at the first end-of-sequence (kept) or the budget, and whether done."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in eos_ids:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


def _cache_keyword(target: Any) -> str:
    """Return the name of the KV-cache argument: `cache` in newer transformers, `past_key_values` before."""
    try:
        params = inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _crop(cache: DynamicCache, keep: int) -> None:
    """Keep the first `keep` positions. A negative count removes tokens in every transformers 5.x
    (a positive one meant "final length" before 5.2x and is refused after)."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)


def _aux(hidden_states: Sequence[torch.Tensor], layer_ids: list[int]) -> torch.Tensor:
    """Return the aux states [B, T, 3*Ht] from `output_hidden_states` (index L = input of layer L)."""
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)


@torch.no_grad()
def greedy_decode(target: Any, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> GreedyResult:
    """Return the target's greedy continuation, one token per forward, with its logit margins."""
    device = target.device
    start = time.perf_counter()
    cache = DynamicCache(config=target.config)
    cache_kw = _cache_keyword(target)
    inputs = torch.tensor([prompt_ids], device=device)
    tokens: list[int] = []
    margins: list[float] = []
    while len(tokens) < max_new_tokens:
        logits = target(input_ids=inputs, use_cache=True, **{cache_kw: cache}).logits[0, -1].float()
        top2 = logits.topk(2).values
        tokens.append(int(logits.argmax()))
        margins.append(float(top2[0] - top2[1]))
        if tokens[-1] in eos_ids:
            break
        inputs = torch.tensor([[tokens[-1]]], device=device)
    return GreedyResult(tokens=tokens, margins=margins, seconds=time.perf_counter() - start)


@torch.no_grad()
def speculative_decode(
    target: Any, proposer: Proposer, prompt_ids: list[int], *, steps: int, topk: int,
    max_new_tokens: int, eos_ids: set[int], sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
) -> SpecResult:
    """Return the tokens of speculative decoding with `proposer` and verification by `target`:
    greedy, or sampled with `sampling` (drawing from `generator`, one seeded by `sampling` if None)."""
    if steps < 1 or topk < 1:
        raise TrainingError(f"steps ({steps}) and topk ({topk}) must be at least 1")
    device = target.device
    layer_ids = proposer.aux_layer_ids
    want_hidden = layer_ids is not None
    n_layers = int(target.config.num_hidden_layers)
    if layer_ids is not None and any(not 0 <= i < n_layers for i in layer_ids):
        raise ModelMismatchError(f"aux layer ids {layer_ids} are outside the target's {n_layers} layers")
    proposer.begin(prompt_ids)
    result = SpecResult(tokens=[], accepted=[])
    cache = DynamicCache(config=target.config)
    cache_kw = _cache_keyword(target)

    t0 = time.perf_counter()
    out = target(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True,
                 output_hidden_states=want_hidden, **{cache_kw: cache})
    result.target_s += time.perf_counter() - t0
    if sampling is not None and generator is None:
        generator = sampling.generator(device, "")
    first = out.logits[0, -1]
    if sampling is not None:
        first_token = int(torch.multinomial(sampling.probs(first), 1, generator=generator))
    else:
        first_token = int(first.argmax())
    seq = torch.tensor(prompt_ids + [first_token], device=device)  # (n,)
    aux = _aux(out.hidden_states, layer_ids)[0] if layer_ids is not None else None  # (n-1, 3Ht)
    result.tokens, done = _finish([int(seq[-1])], max_new_tokens, eos_ids)

    while not done:
        t0 = time.perf_counter()
        paths = proposer.propose(seq, aux, steps, topk)
        result.draft_s += time.perf_counter() - t0
        if not paths or any(not 1 <= len(p) <= steps for p in paths):
            raise TrainingError(f"the proposer returned paths of lengths {[len(p) for p in paths]}, expected 1..{steps}")
        n_paths, n = len(paths), seq.shape[0]
        width = max(len(p) for p in paths)
        t0 = time.perf_counter()
        if n_paths > 1:
            cache.batch_repeat_interleave(n_paths)
        # a tree's shorter paths are padded: tokens past a path's end are never accepted
        verify = torch.tensor([[int(seq[-1])] + p + [p[-1]] * (width - len(p)) for p in paths], device=device)
        lengths = torch.tensor([len(p) for p in paths], device=device)  # (P,)
        positions = torch.arange(n - 1, n + width, device=device).expand(n_paths, -1)
        out = target(input_ids=verify, position_ids=positions, use_cache=True,
                     output_hidden_states=want_hidden, **{cache_kw: cache})
        drafted = verify[:, 1:]
        if sampling is not None:  # (P, W+1): the target's own token after each position
            choice = draw_per_node(out.logits, drafted, lengths, sampling, generator)  # type: ignore[arg-type]
        else:
            choice = out.logits.argmax(-1)
        matches = (drafted == choice[:, :-1]).long().cumprod(-1).sum(-1).minimum(lengths)  # (P,) accepted prefixes
        best = int(matches.argmax())
        a = int(matches[best])
        if n_paths > 1:
            cache.batch_select_indices(torch.tensor([best], device=device))
        _crop(cache, n + a)  # keep [seq..., d1..da]; the bonus token is fed next round
        result.target_s += time.perf_counter() - t0
        new = drafted[best, :a].tolist() + [int(choice[best, a])]
        if layer_ids is not None:
            aux = torch.cat([aux, _aux(out.hidden_states, layer_ids)[best, : a + 1]], dim=0)  # type: ignore[list-item]
        seq = torch.cat([seq, torch.tensor(new, device=device)])
        result.accepted.append(a)
        result.tokens, done = _finish(result.tokens + new, max_new_tokens, eos_ids)
    return result


