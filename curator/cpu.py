"""How many CPU threads torch may use in this process.

torch's default is one thread per core of the machine, whatever this process may actually run
on (a container's CPU set, a `taskset`) and however many other processes share those cores. On a
busy 2-core machine that default made the demo's evaluation (many tiny forwards) ten times
slower than one thread: idle threads spin while they wait for a core.
"""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """Return the number of CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def torch_threads(processes: int | None = None) -> int:
    """Return the torch threads for one of `processes` processes sharing this machine's CPUs
    (default: $LOCAL_WORLD_SIZE under torchrun, else 1)."""
    n = processes if processes is not None else int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, usable_cpus() // max(1, n))


def set_torch_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads (default: `torch_threads()`); return the count set."""
    import torch

    n = threads if threads is not None else torch_threads()
    torch.set_num_threads(n)
    return n
