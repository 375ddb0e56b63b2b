"""Named phases of a training step, for torch.profiler: bench/train_gpu.py sorts the step's GPU time by them.

A phase is a `record_function` range named PREFIX + name; outside a profiler it costs a few
microseconds, a few dozen times per micro-batch.
"""

from __future__ import annotations

from torch.profiler import record_function

PREFIX = "cat:"


def phase(name: str) -> record_function:
    """Return a context manager that marks `name` as a phase of the step."""
    return record_function(PREFIX + name)
