"""The offline estimates of an EAGLE-3 draft on a store's held-out samples: its simulated decoding
(training/eagle3/simulate.py, the figure to trust) beside the teacher-forced acc/cond_acc
(training/eagle3/objective.py); what `curator eval --data` reports next to the measured figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from training.eagle3.model import Eagle3Draft
from training.eagle3.objective import offline_metrics
from training.eagle3.simulate import simulate_acceptance
from training.errors import ModelMismatchError, TrainingError
from training.eval.prompts import HeldOutSplit
from training.eval.simulate import traffic_weighted
from training.storage.reader import HiddenStateStore
from training.target.head import TargetHead


def offline_estimate(
    draft: Eagle3Draft, store_path: str | Path, target_dir: str | Path, split: HeldOutSplit, *,
    steps: int, topk: int = 1, num_draft_tokens: int | None = None, max_samples: int | None = 512,
    max_new_tokens: int | None = None, traffic_shares: dict[str, float] | None = None,
    traffic_groups: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Return both offline estimates on the store's held-out samples (as the checkpoint split them):
    the simulated decoding (`simulated`, the figure to trust) and the teacher-forced acc/cond_acc;
    with `traffic_shares`, the simulated figure weighted by them too (`traffic_weighted`)."""

    store = HiddenStateStore.open(store_path)
    if not store.meta.has_final:
        raise TrainingError(f"store {store_path} has no final hidden states: the offline estimate needs the target's logits")
    stored_ids = list(store.meta.aux_layer_ids)
    if stored_ids != list(draft.config.aux_layer_ids):
        raise ModelMismatchError(
            f"store {store_path} holds layers {stored_ids} (inputs of layers), the draft fuses {draft.config.aux_layer_ids}"
        )
    held, how = split.held_out(store_path, store.ids())
    held = held[:max_samples] if max_samples is not None else held
    if not held:
        raise TrainingError(f"store {store_path} has no samples this draft did not train on ({how})")
    device = next(draft.parameters()).device
    head = TargetHead.from_pretrained(target_dir, dtype=torch.float32, device=device)
    sim = simulate_acceptance(draft, store, held, steps=steps, topk=topk, num_draft_tokens=num_draft_tokens,
                              target_head=head, max_new_tokens=max_new_tokens)
    teacher = offline_metrics(draft, store, held, steps, head)
    out = {"samples": len(held), "split": how, "checkpoint": split.checkpoint,
           "acceptance_length": sim.acceptance_length, "simulated": sim.to_json(), "teacher_forced": teacher}
    if traffic_shares is not None:
        out["traffic_weighted"] = traffic_weighted(sim.categories, traffic_shares, traffic_groups)
    return out
