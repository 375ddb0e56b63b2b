"""The draft vocabulary: the most frequent target tokens in the loss-masked (assistant) parts of
the data, its d2t/t2d maps, and how much of the data it covers.

Draft token i stands for target token `i + d2t[i]`; `t2d[j]` is True when target token j has a
draft id. Draft ids are the chosen target ids in ascending order (as SpecForge lays them out),
so d2t is non-negative and non-decreasing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from training.io.atomic import write_json
from training.errors import StoreError, TrainingError

DEFAULT_DRAFT_VOCAB = 32000


class _Sample(Protocol):
    input_ids: torch.Tensor
    loss_mask: torch.Tensor


@dataclass
class DraftVocab:
    """The draft's tokens (target ids, ascending) and their coverage of the counted data."""

    draft_ids: torch.Tensor  # int64 [draft_vocab]: the target id of each draft token
    target_vocab_size: int
    coverage: float  # share of counted loss-masked tokens whose id is in the draft vocab
    tokens_counted: int
    samples_counted: int
    distinct_tokens: int
    samples_skipped: int = 0  # malformed samples (token ids outside the target vocab)

    @property
    def size(self) -> int:
        """Return the draft vocab size."""
        return int(self.draft_ids.shape[0])

    @property
    def d2t(self) -> torch.Tensor:
        """Return d2t: int64 [draft_vocab], target id - draft id."""
        return self.draft_ids - torch.arange(self.size, dtype=torch.long)

    @property
    def t2d(self) -> torch.Tensor:
        """Return t2d: bool [target_vocab], True for target tokens the draft can propose."""
        mask = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        mask[self.draft_ids] = True
        return mask

    def to_json(self) -> dict[str, Any]:
        """Return vocab.json's content."""
        return {
            "draft_vocab_size": self.size,
            "target_vocab_size": self.target_vocab_size,
            "coverage": self.coverage,
            "tokens_counted": self.tokens_counted,
            "samples_counted": self.samples_counted,
            "distinct_tokens": self.distinct_tokens,
            "samples_skipped": self.samples_skipped,
            "draft_ids": [int(i) for i in self.draft_ids.tolist()],
        }

    def save(self, path: str | Path) -> Path:
        """Write vocab.json atomically; return its path."""
        return write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> DraftVocab:
        """Return the vocab saved in vocab.json at `path`."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(
                draft_ids=torch.tensor(data["draft_ids"], dtype=torch.long),
                target_vocab_size=int(data["target_vocab_size"]),
                coverage=float(data["coverage"]),
                tokens_counted=int(data["tokens_counted"]),
                samples_counted=int(data["samples_counted"]),
                distinct_tokens=int(data["distinct_tokens"]),
                samples_skipped=int(data.get("samples_skipped", 0)),
            )
        except (OSError, ValueError, KeyError) as exc:
            raise TrainingError(f"cannot read the draft vocabulary {path}: {exc}") from exc


def count_tokens(samples: Iterable[_Sample], target_vocab_size: int) -> tuple[torch.Tensor, int, int]:
    """Return (counts int64 [target_vocab], samples counted, samples skipped) over loss-masked tokens.

    A sample with token ids outside the target vocab is skipped and counted as malformed.
    """
    counts = torch.zeros(target_vocab_size, dtype=torch.long)
    n, skipped = 0, 0
    for s in samples:
        ids = s.input_ids.reshape(-1)[s.loss_mask.reshape(-1).bool()].long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= target_vocab_size):
            skipped += 1
            continue
        counts += torch.bincount(ids, minlength=target_vocab_size)
        n += 1
    return counts, n, skipped


def build_vocab(
    counts: torch.Tensor,
    draft_vocab_size: int = DEFAULT_DRAFT_VOCAB,
    samples_counted: int = 0,
    samples_skipped: int = 0,
) -> DraftVocab:
    """Return the draft vocab of the `draft_vocab_size` most frequent ids in `counts` [target_vocab].

    The size is capped to the target vocab. When fewer distinct tokens were seen, the rest is
    filled with unseen ids from the lowest up, so the draft's shape never depends on the data.
    """
    target_vocab = int(counts.shape[0])
    size = min(int(draft_vocab_size), target_vocab)
    total = int(counts.sum())
    if total == 0:
        raise StoreError("no loss-masked tokens to build a draft vocabulary from; check the store's loss masks")
    # stable sort: ties broken by the lower id, so the vocab is deterministic
    order = torch.sort(counts, descending=True, stable=True).indices
    chosen = order[:size]
    draft_ids = torch.sort(chosen).values
    covered = int(counts[draft_ids].sum())
    return DraftVocab(
        draft_ids=draft_ids.long(),
        target_vocab_size=target_vocab,
        coverage=covered / total,
        tokens_counted=total,
        samples_counted=samples_counted,
        distinct_tokens=int((counts > 0).sum()),
        samples_skipped=samples_skipped,
    )


def vocab_from_samples(
    samples: Iterable[_Sample], target_vocab_size: int, draft_vocab_size: int = DEFAULT_DRAFT_VOCAB
) -> DraftVocab:
    """Return the draft vocab counted over `samples` (e.g. a store's training split)."""
    counts, n, skipped = count_tokens(samples, target_vocab_size)
    return build_vocab(counts, draft_vocab_size, samples_counted=n, samples_skipped=skipped)


def coverage(vocab: DraftVocab, samples: Iterable[_Sample]) -> float:
    """Return the share of the loss-masked tokens of `samples` that the draft vocab covers."""
    counts, _, _ = count_tokens(samples, vocab.target_vocab_size)
    total = int(counts.sum())
    return float(counts[vocab.draft_ids].sum()) / total if total else 0.0
