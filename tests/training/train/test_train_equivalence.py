"""The packed training path (PackedTTTObjective) learns exactly what the padded reference (TTTObjective) learns.

On a fixed small batch of samples of different lengths: same loss, same metric sums, same
gradients of every trainable parameter, within float32 rounding; for TTT of 1 and of several
steps, with the full and a reduced draft vocabulary, samples packed into one row or each alone.
"""

from __future__ import annotations

import pytest
import torch

from bench.simulate_bench import MemoryStates
from training.feed.batches import Batch
from training.eagle3.model import DraftConfig, Eagle3Draft
from training.eagle3.objective import (
    PackedTTTObjective,
    TTTObjective,
    packed_call,
    packed_target_signals,
    step_counts,
    target_signals,
)
from training.feed.packing import PackedBatch, from_padded, pack_samples, plan_micro_batches
from training.eagle3.soft_ce import soft_cross_entropy_sum
from training.storage.format import HiddenStateSample
from training.target.head import TargetHead
from training.eagle3.ttt_attention import PackedTTTCache

VOCAB, HIDDEN = 96, 32
LR = 1e-3
LENGTHS = [13, 7, 20, 4]


def _setup(draft_vocab: int) -> tuple[Eagle3Draft, TargetHead, list[HiddenStateSample]]:
    torch.manual_seed(0)
    cfg = DraftConfig(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      vocab_size=VOCAB, draft_vocab_size=draft_vocab, max_position_embeddings=64)
    draft = Eagle3Draft(cfg)
    draft.load_embeddings(torch.randn(VOCAB, HIDDEN))
    if draft_vocab < VOCAB:  # a reduced vocabulary: every other target token
        keep = torch.arange(0, VOCAB, 2)[:draft_vocab]
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[keep] = True
        draft.set_vocab(keep - torch.arange(draft_vocab), t2d)
    head = TargetHead(torch.randn(VOCAB, HIDDEN) * 0.5)
    samples = []
    for i, n in enumerate(LENGTHS):
        mask = torch.ones(n, dtype=torch.bool)
        mask[: n // 3] = False  # a prompt
        samples.append(HiddenStateSample(id=f"s{i}", input_ids=torch.randint(0, VOCAB, (n,)), loss_mask=mask,
                                         aux=torch.randn(n, 3 * HIDDEN), final=torch.randn(n, HIDDEN)))
    return draft, head, samples


def _padded(samples: list[HiddenStateSample]) -> Batch:
    T, B = max(len(s) for s in samples), len(samples)
    batch = Batch([s.id for s in samples], torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.bool),
                  torch.zeros(B, T, 3 * HIDDEN), torch.zeros(B, T, HIDDEN))
    for i, s in enumerate(samples):
        n = len(s)
        batch.input_ids[i, :n], batch.loss_mask[i, :n] = s.input_ids, s.loss_mask
        batch.aux[i, :n], batch.final[i, :n] = s.aux, s.final  # type: ignore[index]
    return batch


def _grads(draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}


def _reference(draft: Eagle3Draft, head: TargetHead, batch: Batch, scale: torch.Tensor, ttt: int):
    draft.zero_grad(set_to_none=True)
    sig = target_signals(batch, head, draft.draft_ids(), draft.t2d)
    loss, sums = TTTObjective(draft)(batch.input_ids, batch.aux, *sig.tensors(), scale, ttt)
    loss.backward()
    return loss.detach(), sums, _grads(draft)


def _packed(draft: Eagle3Draft, head: TargetHead, batches: list[PackedBatch], scale: torch.Tensor, ttt: int,
            recompute: bool | None = None):
    draft.zero_grad(set_to_none=True)
    objective, loss, sums = (PackedTTTObjective(draft, recompute=recompute), torch.zeros(()),
                             torch.zeros(ttt, 6, dtype=torch.float64))
    for batch in batches:
        sig = packed_target_signals(batch, head, draft.draft_ids(), draft.t2d)
        part, part_sums = packed_call(objective, batch, sig, scale, ttt)
        part.backward()
        loss, sums = loss + part.detach(), sums + part_sums
    return loss, sums, _grads(draft)


def _assert_same(ref, new) -> None:
    (loss_r, sums_r, grads_r), (loss_n, sums_n, grads_n) = ref, new
    torch.testing.assert_close(loss_n, loss_r, rtol=1e-5, atol=1e-6)
    assert torch.equal(sums_n[:, 1:5], sums_r[:, 1:5])  # position, correct and prefix counts: exact
    torch.testing.assert_close(sums_n, sums_r, rtol=1e-5, atol=1e-5)
    assert grads_n.keys() == grads_r.keys() and grads_r
    for name in grads_r:
        torch.testing.assert_close(grads_n[name], grads_r[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("ttt", [1, 4])
@pytest.mark.parametrize("draft_vocab", [VOCAB, 40])
def test_packed_and_unpacked_batches_match_the_padded_reference(ttt: int, draft_vocab: int) -> None:
    draft, head, samples = _setup(draft_vocab)
    padded = _padded(samples)
    counts = step_counts(padded.loss_mask, ttt)
    scale = (torch.tensor([0.8**k for k in range(ttt)], dtype=torch.float64) / counts.clamp(min=1)).float()
    ref = _reference(draft, head, padded, scale, ttt)
    store = MemoryStates(samples)
    lengths = {s.id: len(s) for s in samples}
    packs = {
        "one packed row": [pack_samples(store, [s.id for s in samples], 64)],
        "packed by a 24-token budget": [pack_samples(store, ids, 64)
                                        for ids in plan_micro_batches(list(lengths), lengths, 24)],
        "unpacked (padded rows, one sample each)": [from_padded(padded)],
    }
    for name, batches in packs.items():
        assert torch.equal(sum(b.step_counts(ttt) for b in batches), counts), name
        _assert_same(ref, _packed(draft, head, batches, scale, ttt))


@pytest.mark.parametrize("ttt", [2, 5])
def test_recomputed_ttt_steps_give_the_same_loss_and_gradients(ttt: int) -> None:
    """Long rows train with each TTT step recomputed in the backward: the same loss, sums and gradients.

    Against the plain packed path and the padded reference, over a row of several samples and
    over rows packed by a small budget (a step then attends over its own earlier steps only,
    which the recomputation must see again as in the forward).
    """
    draft, head, samples = _setup(40)
    padded = _padded(samples)
    scale = (0.8 ** torch.arange(ttt, dtype=torch.float64) / step_counts(padded.loss_mask, ttt).clamp(min=1)).float()
    ref = _reference(draft, head, padded, scale, ttt)
    store = MemoryStates(samples)
    lengths = {s.id: len(s) for s in samples}
    for batches in ([pack_samples(store, [s.id for s in samples], 64)],
                    [pack_samples(store, ids, 64) for ids in plan_micro_batches(list(lengths), lengths, 24)]):
        plain = _packed(draft, head, batches, scale, ttt, recompute=False)
        recomputed = _packed(draft, head, batches, scale, ttt, recompute=True)
        _assert_same(ref, recomputed)
        for name, grad in plain[2].items():  # the same operations run again: equal to rounding
            torch.testing.assert_close(recomputed[2][name], grad, rtol=1e-6, atol=1e-8, msg=name)


def test_the_compiled_attention_merge_computes_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels.ttt_merge* (the forms the GPU compiles; run as plain torch here) give the padded reference."""
    from training.eagle3 import kernels

    monkeypatch.setattr(kernels, "fused_enabled", lambda x: True)
    ttt = 4
    draft, head, samples = _setup(40)
    padded = _padded(samples)
    scale = (0.8 ** torch.arange(ttt, dtype=torch.float64) / step_counts(padded.loss_mask, ttt).clamp(min=1)).float()
    ref = _reference(draft, head, padded, scale, ttt)
    batch = pack_samples(MemoryStates(samples), [s.id for s in samples], 64)
    _assert_same(ref, _packed(draft, head, [batch], scale, ttt))
    _assert_same(ref, _packed(draft, head, [batch], scale, ttt, recompute=True))


def test_recompute_keeps_as_many_steps_as_the_free_memory_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    from training.eagle3 import objective as obj

    draft, _, _ = _setup(40)
    per_step = obj.step_activation_bytes(draft.config)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    auto = PackedTTTObjective(draft)
    assert auto.recomputed_steps(10**9, 7, cpu) == 0  # the CPU: never (no device memory to save)
    assert PackedTTTObjective(draft, recompute=True).recomputed_steps(8, 7, cpu) == 6  # all but the last
    assert PackedTTTObjective(draft, recompute=3).recomputed_steps(8, 7, cpu) == 3
    assert PackedTTTObjective(draft, recompute=9).recomputed_steps(8, 7, cpu) == 6
    with torch.no_grad():  # evaluation keeps no activations: nothing to recompute
        assert PackedTTTObjective(draft, recompute=True).recomputed_steps(8, 7, cpu) == 0
    # on a GPU with room for 4 steps' activations of a 1000-token row within RECOMPUTE_ABOVE of what is free
    spare = int(4.5 * 1000 * per_step / obj.RECOMPUTE_ABOVE)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (spare - 100, 10 * spare))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 300)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 200)
    assert auto.recomputed_steps(1000, 7, gpu) == 3  # 4 kept, the first 3 recomputed
    assert auto.recomputed_steps(100, 7, gpu) == 0  # a short row: everything kept
    assert auto.recomputed_steps(10**6, 7, gpu) == 6  # a very long one: all but the last


def test_partly_recomputed_unroll_gives_the_same_gradients() -> None:
    ttt = 5
    draft, head, samples = _setup(VOCAB)
    padded = _padded(samples)
    scale = (0.8 ** torch.arange(ttt, dtype=torch.float64) / step_counts(padded.loss_mask, ttt).clamp(min=1)).float()
    ref = _reference(draft, head, padded, scale, ttt)
    batch = pack_samples(MemoryStates(samples), [s.id for s in samples], 64)
    _assert_same(ref, _packed(draft, head, [batch], scale, ttt, recompute=2))


def test_soft_cross_entropy_in_chunks_matches_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows past a chunk are done a chunk at a time (the compiled pass too, past 16K rows): same sum and gradient."""
    from training.eagle3 import soft_ce

    torch.manual_seed(3)
    logits = torch.randn(37, 11, dtype=torch.float64)
    probs = torch.randn(37, 11, dtype=torch.float64).softmax(-1)
    weight = torch.rand(37) > 0.3
    scale = torch.tensor(0.5, dtype=torch.float64)
    outs = []
    for rows in (1000, 8):
        monkeypatch.setattr(soft_ce, "ROWS_PER_CHUNK", rows)
        z = logits.clone().requires_grad_(True)
        scaled, total = soft_cross_entropy_sum(z, probs, weight, scale)
        scaled.backward()
        outs.append((total, z.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-6, atol=0)  # a float32 sum in another order
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=0, atol=0)  # each row's gradient: the same operations


def test_several_optimizer_steps_follow_the_same_weights() -> None:
    """Three AdamW steps on each path end at the same weights (the gradients' agreement compounds)."""
    ttt = 3
    finals = []
    for packed in (False, True):
        draft, head, samples = _setup(40)
        opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=LR)
        padded = _padded(samples)
        scale = (0.8 ** torch.arange(ttt, dtype=torch.float64) / step_counts(padded.loss_mask, ttt)).float()
        batch = pack_samples(MemoryStates(samples), [s.id for s in samples], 64)
        for _ in range(3):
            if packed:
                _packed(draft, head, [batch], scale, ttt)
            else:
                _reference(draft, head, padded, scale, ttt)
            opt.step()
        finals.append(draft.trainable_state_dict())
    # Adam divides by the root of the squared gradient: a rounding-level difference in a near-zero
    # gradient moves a weight by a fraction of one step's size. Within 1% of one step here.
    for name in finals[0]:
        torch.testing.assert_close(finals[1][name], finals[0][name], rtol=0, atol=LR / 100, msg=name)


def test_soft_cross_entropy_matches_autograd_of_the_plain_formula() -> None:
    torch.manual_seed(1)
    logits = torch.randn(9, 17, dtype=torch.float64, requires_grad=True)
    probs = torch.randn(9, 17, dtype=torch.float64).softmax(-1)
    weight = torch.tensor([1, 0, 1, 1, 0, 1, 1, 1, 0], dtype=torch.bool)
    scale = torch.tensor(0.37, dtype=torch.float64)
    plain = (-(probs * torch.log_softmax(logits, -1)).sum(-1) * weight).sum()
    (plain * scale).backward()
    want = logits.grad.clone()
    logits.grad = None
    scaled, total = soft_cross_entropy_sum(logits, probs, weight, scale)
    scaled.backward()
    torch.testing.assert_close(total.double(), plain.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(logits.grad, want, rtol=1e-6, atol=1e-9)


def test_packed_attention_never_lets_one_sample_see_another() -> None:
    """Changing the second sample's keys and values leaves the first sample's outputs as they were."""
    torch.manual_seed(2)
    bounds = [0, 5, 11]
    cu = torch.tensor(bounds, dtype=torch.int32)
    q, k, v = torch.randn(1, 4, 11, 8), torch.randn(1, 2, 11, 8), torch.randn(1, 2, 11, 8)
    first = PackedTTTCache(cu, bounds, 6).attend(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5:] += 3.0
    v2[:, :, 5:] -= 1.0
    second = PackedTTTCache(cu, bounds, 6).attend(q, k2, v2)
    torch.testing.assert_close(first[:, :, :5], second[:, :, :5])
    assert not torch.allclose(first[:, :, 5:], second[:, :, 5:])


def test_micro_batches_respect_the_token_budget_and_keep_every_sample() -> None:
    lengths = {f"s{i}": n for i, n in enumerate([900, 300, 4000, 120, 2500, 700, 1800])}
    plan = plan_micro_batches(list(lengths), lengths, 3000)
    assert sorted(s for mb in plan for s in mb) == sorted(lengths)
    assert all(sum(lengths[s] for s in mb) <= 3000 or len(mb) == 1 for mb in plan)
    assert plan == plan_micro_batches(list(reversed(lengths)), lengths, 3000)  # order-independent
