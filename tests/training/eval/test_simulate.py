"""Simulated decoding on stored states: the same acceptance as real speculative decoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.conftest import toy_corpus

from training.eagle3.model import Eagle3Draft
from training.eval.decode import greedy_decode, speculative_decode
from training.eval.prompts import render_prompt
from training.eagle3.proposer import DraftProposer
from training.eagle3.simulate import simulate_acceptance, simulated_eval
from training.eval.simulate import (
    AcceptanceStats,
    DraftTree,
    TreeBuilder,
    answer_spans,
    walk_cycles,
)
from training.storage.format import HiddenStateSample

STEPS = 3
MAX_NEW = 24
AUX_IDS = [1, 2, 3]  # inputs of layers 1..3 of the 4-layer tiny target


def echo_draft(model, seed: int = 0) -> Eagle3Draft:
    """A draft that proposes the token before last (fc passes layer 1's input, which carries that
    token's embedding; lm_head is the embedding matrix), plus noise from its own random layer. The
    tiny target loops over two tokens, so this draft is right often and wrong often: acceptance is
    neither 1 nor K+1, and both paths of every check are taken."""
    from bench.simulate_bench import echo_draft as bench_echo_draft

    return bench_echo_draft(model, AUX_IDS, seed)


class MemoryStates:
    """Samples held in memory in float32: the simulation sees exactly the states decoding sees."""

    root = Path("memory")

    def __init__(self, samples: list[HiddenStateSample]) -> None:
        self.samples = {s.id: s for s in samples}

    def load_many(self, ids):
        return [self.samples[i] for i in ids]

    def length(self, sid):
        return len(self.samples[sid])

    def category(self, sid):
        return self.samples[sid].category


def greedy_sample(model, tokenizer, sid: str, text: str, new_tokens: int, category: str = "") -> HiddenStateSample:
    """Prompt + the target's greedy continuation, with the states of one full forward (float32)."""
    ids = render_prompt(tokenizer, [{"role": "user", "content": text}])
    seq = torch.tensor(ids + greedy_decode(model, ids, new_tokens, set()).tokens)
    with torch.no_grad():
        hs = model(seq[None], output_hidden_states=True).hidden_states
    mask = torch.zeros(len(seq), dtype=torch.bool)
    mask[len(ids):] = True
    return HiddenStateSample(id=sid, input_ids=seq, loss_mask=mask, aux=torch.cat([hs[i] for i in AUX_IDS], -1)[0],
                             final=hs[-1][0], category=category)


@pytest.fixture(scope="module")
def decoded(target):
    """Per prompt: its ids and its greedy sample (a continuation long enough for the last cycle)."""
    model, tokenizer = target
    out = []
    for i, text in enumerate(toy_corpus(6, seed=21)):
        sample = greedy_sample(model, tokenizer, f"s{i}", text, MAX_NEW + STEPS + 1, "code" if i % 2 else "chat")
        prompt_len = int((~sample.loss_mask).sum())
        out.append((sample.input_ids[:prompt_len].tolist(), sample))
    return out


def measured(model, draft, decoded, topk: int, num_draft_tokens: int | None) -> list[int]:
    accepted = []
    for ids, _ in decoded:
        spec = speculative_decode(model, DraftProposer(draft, num_draft_tokens), ids, steps=STEPS, topk=topk,
                                  max_new_tokens=MAX_NEW, eos_ids=set())
        accepted += spec.accepted
    return accepted


def simulated(draft, decoded, topk: int, num_draft_tokens: int | None, **kw):
    states = MemoryStates([s for _, s in decoded])
    return simulate_acceptance(draft, states, [s.id for _, s in decoded], steps=STEPS, topk=topk,
                               num_draft_tokens=num_draft_tokens, max_new_tokens=MAX_NEW, **kw)


@pytest.mark.parametrize(("topk", "num_draft_tokens"), [(1, None), (3, 6), (2, None)])
def test_simulation_on_the_decoded_states_matches_speculative_decoding_exactly(target, decoded, topk, num_draft_tokens) -> None:
    model, _ = target
    draft = echo_draft(model)
    real = measured(model, draft, decoded, topk, num_draft_tokens)
    sim = simulated(draft, decoded, topk, num_draft_tokens)
    # same cycles, same accepted counts: compared as histograms (the simulation orders samples by length)
    assert sim.overall.histogram() == AcceptanceStats.from_histogram(AcceptanceStats(STEPS, real).histogram()).histogram()
    assert sim.acceptance_length == pytest.approx(1 + sum(real) / len(real), abs=1e-12)
    assert 1.2 < sim.acceptance_length < STEPS + 1  # neither all rejected nor all accepted: a real test


def test_simulation_reports_categories_and_a_greedy_continuation(target, decoded, tiny_target: Path) -> None:
    from training.target.head import TargetHead

    model, _ = target
    sim = simulated(echo_draft(model), decoded, 1, None, target_head=TargetHead.from_pretrained(tiny_target))
    assert set(sim.categories) == {"code", "chat"}
    assert sum(s.forwards for s in sim.categories.values()) == sim.overall.forwards
    assert sim.greedy_agreement == pytest.approx(1.0)
    assert sim.answer_tokens == len(decoded) * MAX_NEW
    report = sim.to_json()
    assert len(report["overall"]["per_position"]) == STEPS and report["seconds_per_1k_tokens"] > 0


def test_a_sampled_continuation_shows_in_greedy_agreement(target, decoded, tiny_target: Path) -> None:
    from training.target.head import TargetHead

    model, _ = target
    ids, sample = decoded[0]
    tampered = sample.input_ids.clone()
    tampered[len(ids) + 2 :: 3] = 7  # every third answer token is not the target's choice
    sample = HiddenStateSample(id="t", input_ids=tampered, loss_mask=sample.loss_mask, aux=sample.aux,
                               final=sample.final)
    sim = simulate_acceptance(echo_draft(model), MemoryStates([sample]), ["t"], steps=STEPS,
                              target_head=TargetHead.from_pretrained(tiny_target))
    assert sim.greedy_agreement is not None and sim.greedy_agreement < 0.8


def test_bf16_stored_states_give_nearly_the_measured_acceptance(target, decoded) -> None:
    """A store keeps bf16 states: the draft then sees rounded inputs, so a few cycles may differ."""
    model, _ = target
    draft = echo_draft(model)
    real = measured(model, draft, decoded, 1, None)
    rounded = [(ids, HiddenStateSample(id=s.id, input_ids=s.input_ids, loss_mask=s.loss_mask,
                                       aux=s.aux.bfloat16().float(), final=s.final, category=s.category))
               for ids, s in decoded]
    sim = simulated(draft, rounded, 1, None)
    assert sim.acceptance_length == pytest.approx(1 + sum(real) / len(real), rel=0.05)


def test_cycles_start_after_each_accepted_run_and_stop_at_the_answer_end() -> None:
    # accepted[t]: what a cycle drafted from origin t accepts; answer span 3..12
    accepted = [0, 0, 2, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0]
    visited, decided = walk_cycles(accepted, [(3, 12)])
    # n=4 (origin 2): 2 -> n=7 (origin 5): 3 -> n=11 (origin 9): 1 -> n=13: done
    assert visited == [2, 3, 1] and decided == 10
    assert walk_cycles(accepted, [(3, 12)], max_new_tokens=4) == ([2], 4)  # prefill token + 2 accepted + bonus
    assert answer_spans([False, True, True, False, True]) == [(1, 2), (4, 4)]
    assert walk_cycles([0] * 5, [(0, 4)]) == ([], 0)  # an answer with no prompt: no draft origin


def test_tree_budget_keeps_the_most_probable_nodes_and_only_reachable_paths() -> None:
    builder = TreeBuilder(topk=2)
    # first beams: tokens 4 (p=.6) and 5 (p=.3)
    first = torch.full((1, 8), -10.0)
    first[0, 4], first[0, 5] = 2.0, 1.3
    builder.first(first)
    children = torch.full((1, 2, 8), -10.0)
    children[0, 0, 6], children[0, 0, 7] = 3.0, 0.0  # under 4: 6 likely, 7 not
    children[0, 1, 1], children[0, 1, 2] = 3.0, 0.0
    builder.extend(children)
    tree = builder.tree()
    assert tree.depth == [1, 1, 2, 2, 2, 2] and tree.parents[0].tolist() == [-1, -1, 0, 0, 1, 1]
    keep = tree.selected(4)  # 3 nodes: 4, 4->6, 5
    assert keep[0].tolist() == [True, True, True, False, False, False]
    assert sorted(tree.paths(keep)) == [[4, 6], [5]]
    orphan = torch.tensor([[False, True, True, False, False, False]])  # 4->6 without 4
    assert tree.paths(orphan) == [[5]]
    assert isinstance(tree, DraftTree)


def test_trainer_eval_split_over_ranks_adds_up_to_the_one_rank_figures(target, decoded) -> None:
    model, _ = target
    draft = echo_draft(model)
    states = MemoryStates([s for _, s in decoded])
    ids = [s.id for _, s in decoded]
    counts = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        counts.append(t.clone())
        return t

    whole = simulated_eval(draft, states, ids, STEPS, reduce=keep)
    for rank in (0, 1):
        simulated_eval(draft, states, ids, STEPS, rank=rank, world=2, reduce=keep)
    assert torch.equal(counts[1] + counts[2], counts[0])
    assert set(whole["sim_categories"]) == {"code", "chat"} and len(whole["sim_per_position"]) == STEPS
    assert 1.0 < whole["sim_accept_length"] < STEPS + 1
