"""Online hidden states: the target runs beside the draft and nothing is written to disk.

For targets that fit on the training GPUs, storing terabytes of states is wasted work: the
target's forward costs about what reading its states back would. `OnlineStates` offers the
read side of a HiddenStateStore (meta, ids, length, category, samples) over a generation
output, tokenised up front with the target's chat template; the trainer asks for whole
batches (`load_many`), which run as one padded forward of the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from training.capture.forward import capture_batch, load_target, pad_batch
from training.capture.prepare import OnDemandStates, PreparedSample, max_positions, prepare_samples, store_meta
from training.capture.stats import ExtractStats
from training.records.chat_tokens import GenerationReadStats, iter_generation
from training.storage.format import HiddenStateSample, StoreMeta


class OnlineStates(OnDemandStates):
    """The trainer's view of a store, computed on demand by the target (see module doc)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        gen_dir: str | Path,
        *,
        layer_ids: list[int] | None = None,
        max_len: int | None = None,
        target: str = "",
    ) -> None:
        self.root = Path(gen_dir)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.meta: StoreMeta = store_meta(
            model.config, tokenizer, target=target or str(gen_dir), layer_ids=layer_ids, dtype="bf16",
            has_final=True, extra={"backend": "online"},
        )
        self.read_stats = GenerationReadStats()
        self.prepare_stats = ExtractStats()
        prepared = prepare_samples(iter_generation(gen_dir, self.read_stats), tokenizer, self.prepare_stats,
                                   done=set(), max_len=max_len, positions=max_positions(model.config))
        self._samples: dict[str, PreparedSample] = {s.id: s for s in prepared}
        self.skipped: dict[str, str] = {}

    @classmethod
    def open(cls, target_dir: str | Path, gen_dir: str | Path, *, device: str | torch.device | None = None,
             layer_ids: list[int] | None = None, max_len: int | None = None) -> OnlineStates:
        """Return online states of `gen_dir` from the target at `target_dir` (loaded on `device`)."""
        model, tokenizer = load_target(target_dir, device)
        return cls(model, tokenizer, gen_dir, layer_ids=layer_ids, max_len=max_len, target=str(target_dir))

    @torch.no_grad()
    def load_many(self, ids: list[str]) -> list[HiddenStateSample]:
        """Return the samples `ids` with their states, from one padded forward of the target."""
        prepared = [self._samples[sid] for sid in ids]
        device = next(self.model.parameters()).device
        input_ids, mask = pad_batch([p.input_ids for p in prepared], self.tokenizer.pad_token_id or 0)
        states = capture_batch(self.model, input_ids.to(device), mask.to(device), self.meta.aux_layer_ids, True)
        assert states.final is not None
        return [
            HiddenStateSample(id=p.id, input_ids=p.input_ids, loss_mask=p.loss_mask,
                              aux=states.aux[i, : len(p.input_ids)], final=states.final[i, : len(p.input_ids)],
                              category=p.category)
            for i, p in enumerate(prepared)
        ]
