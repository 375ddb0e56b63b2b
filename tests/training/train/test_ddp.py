"""torchrun-style data parallelism on CPU (gloo): 2 ranks reproduce the 1-rank run for the same global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.train.test_trainer import one_thread, sharp_target, store_dir, tiny_config  # noqa: F401  (fixtures)
from training.train.trainer import train, train_local_ranks

# Same global batch, same samples per step: only the order of floating-point sums differs
# (per-rank partial sums, then the all-reduce), so losses agree to float32 rounding.
LOSS_TOLERANCE = 1e-4


def _train_losses(run: Path) -> list[tuple[int, float, list[float]]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["acc"]) for r in rows if r["split"] == "train"]


@pytest.mark.slow
def test_two_ranks_reproduce_the_one_rank_loss_curve(store_dir: Path, sharp_target: Path, tmp_path: Path) -> None:
    kw = dict(max_steps=6, log_every=1, global_batch_size=8, micro_batch_size=4, eval_fraction=0.1)
    single = tiny_config(store_dir, sharp_target, tmp_path / "one", **kw)
    train(single)
    double = tiny_config(store_dir, sharp_target, tmp_path / "two", **kw)
    train_local_ranks(double, 2, threads_per_rank=1)

    one, two = _train_losses(tmp_path / "one"), _train_losses(tmp_path / "two")
    assert [s for s, _, _ in one] == [s for s, _, _ in two] == list(range(1, 7))
    for (_, loss1, acc1), (_, loss2, acc2) in zip(one, two):
        assert abs(loss1 - loss2) <= LOSS_TOLERANCE
        assert all(abs(a - b) <= 0.02 for a, b in zip(acc1, acc2))  # an argmax tie may flip one position
    assert one[-1][1] < one[0][1]  # and it is training, not standing still
    # rank 0 alone writes the run: one checkpoint, one metrics line per step
    assert len(list((tmp_path / "two" / "checkpoints").glob("step-*"))) == 1
