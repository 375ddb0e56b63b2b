"""The simulated acceptance estimate on a CPU: its cost (seconds per 1,000 held-out tokens) and its error
against acceptance measured by real speculative decoding of the same prompts.

A Llama target (random init, built on the spot; its greedy continuations fall into loops, which a
draft can learn to predict) and an "echo" EAGLE-3 draft that proposes the token before last (fc
passes the target's layer-1 input, lm_head is the embedding matrix) plus its own random layer, so it
is right about as often as a weak real draft. Per prompt: the target's greedy continuation and its
hidden states from one forward, kept in float32 (what decoding sees) and rounded to bf16 (what a store
keeps); then

  measured   training.eval.decode.speculative_decode with the draft (the target verifies)
  simulated  training.eagle3.simulate.simulate_acceptance on the stored continuations (timed)
  teacher    training.eagle3.objective.offline_metrics, the teacher-forced estimate (timed)

    PYTHONPATH=. python bench/simulate_bench.py                 # hidden 256, 4 layers, 48 prompts
    PYTHONPATH=. python bench/simulate_bench.py --topk 4 --num-draft-tokens 8

The reference benchmark (bench/reference/run.py) reports the same error at each pool size on a GPU.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from training.eagle3.model import DraftConfig, Eagle3Draft  # noqa: E402
from training.eval.decode import greedy_decode, speculative_decode  # noqa: E402
from training.eval.evaluate import load_target  # noqa: E402
from training.eval.prompts import render_prompt  # noqa: E402
from training.eagle3.proposer import DraftProposer  # noqa: E402
from training.eagle3.objective import offline_metrics  # noqa: E402
from training.eagle3.simulate import simulate_acceptance  # noqa: E402
from training.storage.format import HiddenStateSample  # noqa: E402
from training.target.head import TargetHead  # noqa: E402
from training.target.toy import build_target  # noqa: E402

WORDS = ("def return import class self value list dict print for while if else try except lambda yield "
         "with open file read write path json data model token layer hidden state draft target").split()


class MemoryStates:
    """Samples in memory, read as a store is."""

    root = Path("memory")

    def __init__(self, samples: list[HiddenStateSample]) -> None:
        self.samples = {s.id: s for s in samples}

    def ids(self) -> list[str]:
        return list(self.samples)

    def load_many(self, ids: list[str]) -> list[HiddenStateSample]:
        return [self.samples[i] for i in ids]

    def length(self, sid: str) -> int:
        return len(self.samples[sid])

    def category(self, sid: str) -> str:
        return self.samples[sid].category


def echo_draft(model, aux_ids: list[int], seed: int) -> Eagle3Draft:
    """Return the echo draft described in the module doc."""
    torch.manual_seed(seed)
    cfg = DraftConfig.from_target_config(model.config.to_dict(), draft_vocab_size=model.config.vocab_size,
                                         aux_layer_ids=aux_ids)
    draft = Eagle3Draft(cfg)
    embed = model.get_input_embeddings().weight
    draft.load_embeddings(embed)
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, : cfg.hidden_size] = torch.eye(cfg.hidden_size)
        draft.lm_head.weight.copy_(embed)
    return draft.eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24))) for _ in range(400)]
    aux_ids = [1, args.layers // 2, args.layers - 1]
    with tempfile.TemporaryDirectory() as tmp:
        build_target(corpus, tmp, vocab_size=args.vocab, seed=args.seed, hidden_size=args.hidden,
                     num_layers=args.layers, num_heads=max(2, args.hidden // 64))
        model, tokenizer = load_target(tmp)
        head = TargetHead.from_pretrained(tmp)
        draft = echo_draft(model, aux_ids, args.seed)
        exact, rounded, measured, prompts = [], [], [], []
        for i, text in enumerate(corpus[: args.prompts]):
            ids = render_prompt(tokenizer, [{"role": "user", "content": text}])
            # beyond the budget too: the last cycle's drafts are judged against the target's own tokens
            seq = torch.tensor(ids + greedy_decode(model, ids, args.new_tokens + args.steps + 1, set()).tokens)
            with torch.no_grad():
                hs = model(seq[None], output_hidden_states=True).hidden_states
            mask = torch.zeros(len(seq), dtype=torch.bool)
            mask[len(ids):] = True
            aux = torch.cat([hs[j] for j in aux_ids], -1)[0]
            category = "even" if i % 2 == 0 else "odd"
            exact.append(HiddenStateSample(f"s{i}", seq, mask, aux, hs[-1][0], category))
            rounded.append(HiddenStateSample(f"s{i}", seq, mask, aux.bfloat16().float(), hs[-1][0].bfloat16().float(), category))
            prompts.append(ids)
        t0 = time.perf_counter()
        for ids in prompts:
            spec = speculative_decode(model, DraftProposer(draft, args.num_draft_tokens), ids, steps=args.steps,
                                      topk=args.topk, max_new_tokens=args.new_tokens, eos_ids=set())
            measured += spec.accepted
        decode_s = time.perf_counter() - t0
        measured_al = 1 + sum(measured) / len(measured)
        kw = dict(steps=args.steps, topk=args.topk, num_draft_tokens=args.num_draft_tokens, batch_size=args.batch,
                  max_new_tokens=args.new_tokens)
        ids_all = [s.id for s in exact]
        sim_exact = simulate_acceptance(draft, MemoryStates(exact), ids_all, **kw)
        sim_bf16 = simulate_acceptance(draft, MemoryStates(rounded), ids_all, **kw)
        t0 = time.perf_counter()
        teacher = offline_metrics(draft, MemoryStates(rounded), ids_all, args.steps, head, batch_size=args.batch)
        teacher_s = time.perf_counter() - t0
    tokens = sim_exact.tokens
    print(f"target hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; {args.prompts} prompts, "
          f"{args.new_tokens} new tokens each; K={args.steps} topk={args.topk} "
          f"num_draft_tokens={sim_exact.num_draft_tokens}; {tokens} held-out tokens; {args.threads} CPU thread(s)")
    print(f"{'figure':<34} {'accept length':>13} {'error':>8} {'s / 1k tokens':>13}")
    rows = [("measured (speculative decoding)", measured_al, None, 1000 * decode_s / tokens),
            ("simulated, decoding's own states", sim_exact.acceptance_length, sim_exact.seconds_per_1k_tokens(), None),
            ("simulated, bf16-stored states", sim_bf16.acceptance_length, sim_bf16.seconds_per_1k_tokens(), None),
            ("teacher-forced (acc_k)", teacher["accept_length"], 1000 * teacher_s / tokens, None)]
    for name, al, cost, decode_cost in rows:
        err = "" if name.startswith("measured") else f"{al / measured_al - 1:+.1%}"
        cost_s = cost if cost is not None else decode_cost
        print(f"{name:<34} {al:>13.3f} {err:>8} {cost_s:>13.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
