"""Test-only: vLLM's ExampleHiddenStatesConnector with its device-to-host copy done plainly, for the CPU.

Runs inside the vLLM server (its engine core imports it through vLLM's own connector factory:
`--kv-transfer-config '{"kv_connector": "CpuHiddenStatesConnector", "kv_connector_module_path":
"cpu_hidden_states_connector", ...}'`, with this folder on PYTHONPATH). It is the one departure from
the engine's code in the real-engine tests (docs/engines.md).

vLLM 0.32's connector copies the captured states out of its KV cache on a CUDA stream into pinned
host memory and marks the copy done with a CUDA event; on a CPU build `pin_memory=True` raises on the
first request. Everything else is the engine's: the file names (`<shared_storage_path>/<request
id>.safetensors`), the tensors ({hidden_states, token_ids}), the `.lock` file created and held
exclusively before the answer leaves, the writer thread that releases it, the scheduler side. Only
`_submit_async_write` is replaced: the states are indexed out of the (host) cache with vLLM's own
`extract_from_kv_cache`, cloned, and handed to the same writer with an already-completed "event".
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event of the copy: on the CPU the copy is finished when it returns."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector whose copy out of the KV cache is a plain CPU copy."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        # the slots of the request's blocks, in order: block b holds slots [b*size, (b+1)*size)
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size, dtype=torch.long)[None, :]).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        assert self._req_futures.get(pending.req_id) is None, "two hidden-state writes for one request id"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:  # as the engine does when wait_for_save made none
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done  # type: ignore[assignment]
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
