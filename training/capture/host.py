"""Moving captured states off the GPU and onto disk without stalling the forward: a host copier
(pinned buffers, a copy stream) and a background writer thread.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import torch

from training.capture.forward import CapturedStates
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.fp8 import quantize_fp8
from training.storage.writer import StoreWriter


class BackgroundWriter:
    """Runs StoreWriter.add on a thread, so shard serialisation and disk writes overlap the next forward."""

    def __init__(self, writer: StoreWriter, depth: int = 4) -> None:
        self.writer = writer
        self._queue: queue.Queue[tuple[list[HiddenStateSample], HostStates | None] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.stored = 0
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue
            batch, host = item
            try:
                if host is not None:
                    host.wait()  # the copy from the GPU may still be in flight
                for s in batch:
                    self.stored += int(self.writer.add(s))
            except BaseException as exc:  # re-raised in the caller's thread by put()/close()
                self._error = exc

    def put(self, samples: list[HiddenStateSample], host: HostStates | None = None) -> None:
        """Queue samples (views of `host`, when given: waited on first); re-raise a writer failure."""
        if self._error is not None:
            raise self._error
        self._queue.put((samples, host))

    def close(self) -> None:
        """Wait for every queued sample, flush the last shard, re-raise a failure."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self.writer.close()


@dataclass
class HostStates:
    """A batch's states on the host, as the store keeps them: bf16, or fp8 values with scales."""

    aux: torch.Tensor  # (B, T, n_aux*H)
    final: torch.Tensor | None  # (B, T, H)
    aux_scale: torch.Tensor | None = None  # (B, T, n_aux) float32, fp8 only
    final_scale: torch.Tensor | None = None  # (B, T, 1)
    final_prenorm: torch.Tensor | None = None  # (B, T, H) bf16, has_final_prenorm stores only
    # Set when the copy from the GPU is still in flight: wait on it before reading the tensors.
    ready: Any = None

    def rows(self, b: int, t: int) -> dict[str, torch.Tensor | None]:
        """Return sample `b`'s first `t` tokens as HiddenStateSample fields (views: no copy)."""
        return {name: (x[b, :t] if x is not None else None)
                for name, x in (("aux", self.aux), ("final", self.final), ("aux_scale", self.aux_scale),
                                ("final_scale", self.final_scale), ("final_prenorm", self.final_prenorm))}

    def wait(self) -> None:
        """Block until the tensors hold the copied values."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None


class HostCopier:
    """Copies a batch's states from the GPU into pinned host memory on a side stream.

    A plain `.to("cpu")` of ~0.5 GB blocks the Python thread for the copy into freshly
    allocated pageable memory (page faults included), with the GPU idle until the next batch is
    queued. Here the copy is queued behind the forward on its own stream, into pinned buffers
    that torch's caching host allocator recycles, and the next forward starts at once; the
    writer thread waits on the copy's event (`HostStates.wait`) before it touches the bytes.
    """

    def __init__(self) -> None:
        # One side stream per GPU: with device_map the states come off the model's last GPU.
        self._streams: dict[int, torch.cuda.Stream] = {}

    @staticmethod
    def _copy(t: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        t.record_stream(stream)  # keep the GPU block alive until the copy has read it
        return host

    def __call__(self, states: CapturedStates, meta: StoreMeta) -> HostStates:
        """Return the batch as the store keeps it; an fp8 store's states are quantised first,
        where they are (the GPU), so half the bytes cross to the host and the writer does less."""
        if meta.dtype != "fp8":
            parts = {"aux": states.aux, "final": states.final, "final_prenorm": states.final_prenorm}
        else:
            B, T, W = states.aux.shape
            q, scale = quantize_fp8(states.aux.reshape(B * T, W), len(meta.aux_layer_ids))
            parts = {"aux": q.reshape(B, T, W), "aux_scale": scale.reshape(B, T, -1), "final": None}
            if states.final is not None:
                fq, fscale = quantize_fp8(states.final.reshape(B * T, -1), 1)
                parts.update(final=fq.reshape(B, T, -1), final_scale=fscale.reshape(B, T, 1))
        device = states.aux.device
        if device.type != "cuda":
            # parts always holds "aux"; only the optional tensors are None
            return HostStates(**{k: (v.to("cpu") if v is not None else None) for k, v in parts.items()})  # type: ignore[arg-type]
        with torch.cuda.device(device):
            stream = self._streams.get(device.index)
            if stream is None:
                stream = self._streams[device.index] = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                host = {k: (self._copy(v, stream) if v is not None else None) for k, v in parts.items()}
                # blocking: the writer thread sleeps on it instead of spinning a core the
                # shard threads need
                event = torch.cuda.Event(blocking=True)
                event.record(stream)
        return HostStates(**host, ready=event)  # type: ignore[arg-type]


