"""Sampled verification (curator eval --temperature): lossless, and what the simulation replays.

SGLang verifies a sampled request with target-only tree speculative sampling (thresholds 1.0):
child c of a node is accepted with probability p(c), and after a rejection the bonus token comes
from p without the rejected children. `training.eval.decode` draws one token x ~ p per node and
accepts the child equal to x, which has that law. Two consequences are tested here:
- the output is a sample of the target at that temperature, whatever the draft proposes;
- simulating decoding on the sampled output's own states gives exactly the cycles that decoding
  had, so the offline simulation on answers sampled at the serving temperature estimates
  acceptance at that temperature.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from tests.conftest import toy_corpus
from tests.training.eval.test_simulate import AUX_IDS, MemoryStates, echo_draft

from training.errors import TrainingError
from training.eval.decode import speculative_decode
from training.eval.evaluate import evaluate
from training.eval.prompts import EvalPrompt, render_prompt
from training.eagle3.proposer import DraftProposer
from training.eval.sampling import Sampling
from training.eagle3.simulate import simulate_acceptance
from training.eval.simulate import AcceptanceStats
from training.storage.format import HiddenStateSample

STEPS = 3
# The tiny target is random-init: its logits spread over ~0.15, so T=0.04 makes a peaked but not
# one-hot distribution (top token ~0.6), where drafts are accepted often and rejected often.
T = 0.04


def prompt_ids(tokenizer, i: int) -> list[int]:
    return render_prompt(tokenizer, [{"role": "user", "content": toy_corpus(8, seed=21)[i]}])


def states_of(model, sid: str, ids: list[int], new: list[int]) -> HiddenStateSample:
    seq = torch.tensor(ids + new)
    with torch.no_grad():
        hs = model(seq[None], output_hidden_states=True).hidden_states
    mask = torch.zeros(len(seq), dtype=torch.bool)
    mask[len(ids):] = True
    return HiddenStateSample(id=sid, input_ids=seq, loss_mask=mask, aux=torch.cat([hs[i] for i in AUX_IDS], -1)[0],
                             final=hs[-1][0])


@pytest.mark.parametrize(("topk", "num_draft_tokens"), [(1, None), (3, 6)])
def test_simulating_a_sampled_run_on_its_own_output_replays_its_cycles(target, topk, num_draft_tokens) -> None:
    model, tokenizer = target
    draft = echo_draft(model)
    sampling = Sampling(T, seed=3)
    measured: list[int] = []
    samples, outputs = [], []
    for i in range(6):
        ids = prompt_ids(tokenizer, i)
        spec = speculative_decode(model, DraftProposer(draft, num_draft_tokens), ids, steps=STEPS, topk=topk,
                                  max_new_tokens=24, eos_ids=set(), sampling=sampling,
                                  generator=sampling.generator("cpu", f"p{i}"))
        measured += spec.accepted
        outputs.append(spec.tokens)
        # the run may overshoot the budget by the last cycle's tokens: store them so its cycle is whole
        samples.append(states_of(model, f"p{i}", ids, spec.tokens + [0] * (STEPS + 1)))
    sim = simulate_acceptance(draft, MemoryStates(samples), [s.id for s in samples], steps=STEPS, topk=topk,
                              num_draft_tokens=num_draft_tokens, max_new_tokens=24)
    assert sim.overall.histogram() == AcceptanceStats(STEPS, measured).histogram()
    assert 1.1 < sim.acceptance_length < STEPS + 1  # accepted and rejected cycles both occur
    greedy = [speculative_decode(model, DraftProposer(draft), prompt_ids(tokenizer, i), steps=STEPS, topk=1,
                                 max_new_tokens=24, eos_ids=set()).tokens for i in range(6)]
    assert outputs != greedy  # it sampled


class TargetProposer:
    """Proposes the target's own top tokens (no aux states): a root with `topk` children, each
    continued greedily. Its first token is accepted with probability p(top 1) + ... + p(top k), so
    a verifier that accepts too often or too rarely changes the output's law visibly."""

    aux_layer_ids = None

    def __init__(self, model) -> None:
        self.model = model

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, aux, steps: int, topk: int) -> list[list[int]]:
        roots = self.model(tokens[None]).logits[0, -1].topk(topk).indices.tolist()
        paths = []
        for root in roots:
            path = [root]
            while len(path) < steps:
                seq = torch.cat([tokens, torch.tensor(path)])
                path.append(int(self.model(seq[None]).logits[0, -1].argmax()))
            paths.append(path)
        return paths


def exact_second_token(model, ids: list[int], sampling: Sampling) -> dict[int, float]:
    """P(second new token) = sum over x1 of p(x1) p(x2 | x1), the target's own law at this temperature."""
    with torch.no_grad():
        p1 = sampling.probs(model(torch.tensor([ids])).logits[0, -1])
        firsts = [int(t) for t in (p1 > 1e-5).nonzero()[:, 0]]
        batch = torch.tensor([ids + [x] for x in firsts])
        p2 = sampling.probs(model(batch).logits[:, -1])  # (n, V)
    law = (p1[firsts][:, None] * p2).sum(0)
    return {int(t): float(law[t]) for t in (law > 0).nonzero()[:, 0]}


@pytest.mark.slow
@pytest.mark.parametrize("topk", [1, 2])
def test_sampled_speculative_decoding_samples_the_target_whatever_the_draft(target, topk) -> None:
    model, tokenizer = target
    sampling = Sampling(T, top_k=3, seed=11)
    ids = prompt_ids(tokenizer, 0)
    runs = 600
    generator = sampling.generator("cpu", "law")
    seconds: Counter[int] = Counter()
    accepted = 0
    for _ in range(runs):
        spec = speculative_decode(model, TargetProposer(model), ids, steps=STEPS, topk=topk,
                                  max_new_tokens=2, eos_ids=set(), sampling=sampling, generator=generator)
        seconds[spec.tokens[1]] += 1
        accepted += spec.accepted[0] > 0
    law = exact_second_token(model, ids, sampling)
    tv = 0.5 * sum(abs(seconds[t] / runs - law.get(t, 0.0)) for t in set(seconds) | set(law))
    # sampling noise alone: E[TV] is about 0.03 here (support of at most 9 tokens, 600 runs)
    assert tv < 0.06, (tv, seconds.most_common(5), sorted(law.items(), key=lambda kv: -kv[1])[:5])
    assert 0.1 < accepted / runs < 0.9  # the draft's token was accepted in some runs and rejected in others


def test_sampling_settings_and_the_report(target) -> None:
    model, tokenizer = target
    with pytest.raises(TrainingError, match="temperature"):
        Sampling(0.0)
    probs = Sampling(1.0, top_k=2).probs(torch.tensor([3.0, 2.0, 1.0, 0.0]))
    assert (probs[2:] == 0).all() and probs.sum() == pytest.approx(1.0)
    nucleus = Sampling(1.0, top_p=0.6).probs(torch.tensor([0.0, 3.0, 2.9, -5.0]))
    assert nucleus[1] > 0 and nucleus[2] > 0 and nucleus[0] == 0 and nucleus[3] == 0  # 0.6 needs the top two (0.51, 0.46)
    assert (Sampling(1.0, top_p=0.3).probs(torch.zeros(4)) == 0.25).all()  # ties at the pivot all stay, as in SGLang
    prompts = [EvalPrompt(id=f"p{i}", messages=[{"role": "user", "content": toy_corpus(4, seed=5)[i]}]) for i in range(2)]
    kw = dict(steps=STEPS, max_new_tokens=12, sampling=Sampling(T, seed=1))
    one = evaluate(model, tokenizer, DraftProposer(echo_draft(model)), prompts, **kw)
    two = evaluate(model, tokenizer, DraftProposer(echo_draft(model)), prompts[::-1], **kw)
    assert {p.greedy_match for p in one.prompts} == {"sampled"} and one.greedy_s == 0.0
    # each prompt draws from its own generator: the order of prompts changes nothing
    assert {p.id: p.acceptance_length for p in one.prompts} == {p.id: p.acceptance_length for p in two.prompts}
    assert one.to_json()["sampling"] == {"temperature": T, "top_k": 0, "top_p": 1.0, "seed": 1}


def test_cli_eval_samples_at_a_temperature_and_refuses_top_p_alone(target, tiny_target: Path, tmp_path: Path) -> None:
    import json

    from tests.training.eval.test_evaluate import export_random_draft

    from curator.cli import main

    model, _ = target
    export = export_random_draft(model, tiny_target, tmp_path)
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(toy_corpus(3, seed=9)) + "\n")
    common = ["eval", "--model", str(tiny_target), "--draft", str(export), "--prompts", str(prompts),
              "--steps", str(STEPS), "--max-new-tokens", "8", "--device", "cpu"]
    assert main([*common, "--top-p", "0.9"]) == 1  # top-p without a temperature: a usage error
    out = tmp_path / "eval.json"
    assert main([*common, "--temperature", str(T), "--top-k", "5", "--seed", "4", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["sampling"] == {"temperature": T, "top_k": 5, "top_p": 1.0, "seed": 4}
    assert {p["greedy_match"] for p in report["per_prompt"]} == {"sampled"} and report["prompts_decoded"] == 3


def test_each_node_is_drawn_from_its_own_position_and_shared_nodes_once() -> None:
    from training.eval.sampling import draw_per_node

    # 2 paths sharing their first drafted token (7): positions (0,0)=(1,0) are the root and (0,1)=(1,1)
    # the node after 7, so each pair must get one draw; every other position is its own node.
    drafted = torch.tensor([[7, 8, 9], [7, 5, 0]])
    lengths = torch.tensor([3, 2])
    vocab = 40
    logits = torch.full((2, 4, vocab), -1e4)
    for p in range(2):
        for i in range(4):
            logits[p, i, 10 + 4 * p + i] = 0.0  # a one-hot law: a token unique to (path, position)
    logits[1, 0], logits[1, 1] = logits[0, 0], logits[0, 1]  # shared nodes have one law
    choice = draw_per_node(logits, drafted, lengths, Sampling(1.0), torch.Generator().manual_seed(0))
    assert choice[0].tolist() == [10, 11, 12, 13]
    assert choice[1, :3].tolist() == [10, 11, 16]  # past path 1's end (position 3) nothing is read
    # a shared node drawn twice would disagree between the paths half the time with a spread law
    spread = torch.zeros(2, 4, vocab)
    agree = all(
        (lambda c: c[0, 0] == c[1, 0] and c[0, 1] == c[1, 1])(
            draw_per_node(spread, drafted, lengths, Sampling(1.0), torch.Generator().manual_seed(s)))
        for s in range(20))
    assert agree
