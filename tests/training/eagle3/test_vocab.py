"""The draft vocabulary: most frequent assistant tokens, d2t/t2d as SGLang reads them, coverage reported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from training.target.draft_vocab import DraftVocab, build_vocab, count_tokens, coverage, vocab_from_samples


@dataclass
class S:
    input_ids: torch.Tensor
    loss_mask: torch.Tensor


def sample(ids: list[int], mask: list[int]) -> S:
    return S(torch.tensor(ids), torch.tensor(mask, dtype=torch.bool))


def test_vocab_keeps_the_most_frequent_loss_masked_tokens() -> None:
    # token 9 is frequent but only in the prompt: it must not take a draft slot
    data = [sample([9, 9, 9, 9, 1, 2, 2, 3], [0, 0, 0, 0, 1, 1, 1, 1]), sample([9, 2, 5, 5, 5], [0, 1, 1, 1, 1])]
    vocab = vocab_from_samples(data, target_vocab_size=12, draft_vocab_size=2)
    assert vocab.draft_ids.tolist() == [2, 5]  # ascending target ids
    assert vocab.d2t.tolist() == [2, 4]  # target id - draft id
    assert vocab.t2d.nonzero().flatten().tolist() == [2, 5] and vocab.t2d.shape == (12,)
    assert abs(vocab.coverage - 6 / 8) < 1e-9 and vocab.tokens_counted == 8


def test_vocab_size_is_capped_and_filled_when_data_is_small() -> None:
    vocab = vocab_from_samples([sample([3, 4], [1, 1])], target_vocab_size=10, draft_vocab_size=32000)
    assert vocab.size == 10 and vocab.coverage == 1.0
    small = vocab_from_samples([sample([7, 7], [1, 1])], target_vocab_size=10, draft_vocab_size=3)
    assert small.draft_ids.tolist() == [0, 1, 7]  # the seen token plus unseen ids from the lowest up


def test_malformed_samples_are_counted_and_skipped() -> None:
    counts, n, skipped = count_tokens([sample([1, 99], [1, 1]), sample([1, 2], [1, 1])], 10)
    assert (n, skipped) == (1, 1) and counts[1] == 1


def test_vocab_round_trips_through_vocab_json(tmp_path: Path) -> None:
    vocab = build_vocab(torch.tensor([5, 0, 3, 9, 1]), 3, samples_counted=2)
    loaded = DraftVocab.load(vocab.save(tmp_path / "vocab.json"))
    assert torch.equal(loaded.draft_ids, vocab.draft_ids) and loaded.coverage == vocab.coverage
    assert coverage(loaded, [sample([0, 4], [1, 1])]) == 0.5
