"""Stopping a training run that goes non-finite, and saying why: the data, or the optimisation.

A NaN or inf anywhere (a state in the store, the loss, a weight) spreads to every weight within a
step or two, and a run that keeps going reports a draft of NaNs as a success. Checking every step
would cost a host sync each; instead each micro-batch's states get a reduction on the device
(a flag, no sync), and the flags, the loss sums and the weights are read where the loop already
syncs: at each log interval, and before every checkpoint is written. What is found there stops
the run on every rank at once (the verdict is all-reduced):

- states that are NaN/inf: StoreIntegrityError naming the samples (the store is refused);
- otherwise a non-finite loss or weights: DivergedError naming the steps and the lr.

Nothing is saved after either, so the newest checkpoint is the last finite one.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from training.runtime.distributed import all_reduce_sum
from training.errors import DivergedError, StoreIntegrityError
from training.io.weights import nonfinite_tensors


class _StatesBatch(Protocol):
    ids: list[str]
    aux: torch.Tensor
    final: torch.Tensor


class NonFiniteWatch:
    """Collects per-micro-batch finiteness flags on the device; `check` reads them and raises."""

    def __init__(self, store: Any, params: dict[str, torch.Tensor], device: torch.device, since_step: int = 0) -> None:
        self.store = store
        self.params = params
        self.device = device
        self.since_step = since_step  # the last step checked (its weights and loss were finite)
        self._flags: list[tuple[list[str], torch.Tensor]] = []

    def watch(self, batch: _StatesBatch) -> None:
        """Note whether a micro-batch's states (on the training device) are all finite; no host sync.

        A float32 sum carries any NaN/inf through, in one reduction (no bool tensor the size of the
        states: 7x faster than isfinite().all() on the CPU); `check` confirms a flag by re-reading.
        """
        total = batch.aux.sum(dtype=torch.float32) + batch.final.sum(dtype=torch.float32)
        self._flags.append((batch.ids, torch.isfinite(total)))

    def check(self, step: int, sums: torch.Tensor | None, lr: float | torch.Tensor) -> None:
        """Raise when the states, `sums` (the loss and metric sums) or the weights since the last check hold NaN/inf.

        `lr` is named in the error: a scheduler's get_last_lr() entry (a float, or a tensor lr's 0-dim tensor)."""
        flags, self._flags = self._flags, []
        named: list[str] = []
        if flags:
            finite = torch.stack([flag for _, flag in flags]).cpu().tolist()
            flagged = [sid for (ids, _), ok in zip(flags, finite) if not ok for sid in ids]
            # only flagged micro-batches are read again (a few samples, and only when something is wrong)
            named = [s.id for s in self.store.load_many(flagged) if not s.is_finite()] if flagged else []
        loss_bad = sums is not None and not bool(torch.isfinite(sums).all())
        verdict = all_reduce_sum(torch.tensor([len(named), int(loss_bad)], device=self.device)).tolist()
        if verdict[0]:
            raise self._bad_data(named, step)
        weights_bad = nonfinite_tensors(self.params)
        if verdict[1] or weights_bad:
            what = " and ".join(filter(None, ["the loss" if verdict[1] else "",
                                              f"the weights ({', '.join(weights_bad[:3])})" if weights_bad else ""]))
            raise DivergedError(
                f"training diverged: {what} became NaN/inf between steps {self.since_step} and {step} "
                f"(lr {lr:.3g}); the last checkpoint saved is the last finite one. Lower lr (or grad_clip) and "
                "train again in a new out")
        self.since_step = step

    def _bad_data(self, named: list[str], step: int) -> StoreIntegrityError:
        """Return the error naming the samples (this rank's) whose states are NaN/inf."""
        where = getattr(self.store, "root", "the training data")
        which = (f"sample(s) {', '.join(repr(i) for i in named[:5])}{' ...' if len(named) > 5 else ''}" if named
                 else "samples read by another rank")
        return StoreIntegrityError(
            f"{where}: {which} hold NaN/inf hidden states (found by step {step}); the store is refused, nothing was "
            "saved after the last finite checkpoint. Capture those samples again (`curator hidden-states` skips "
            "and counts non-finite states) or remove them from the store's index")
