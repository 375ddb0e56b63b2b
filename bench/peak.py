"""The ceiling the GPU benchmarks report against: the matmul rate measured in the same run."""

from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timings read a host clock)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_tflops(device: torch.device, size: int = 8192, iters: int = 30) -> float:
    """Return the measured bf16 (CUDA) or fp32 (CPU) matmul rate in TFLOP/s on a size^3 product.

    Random operands, not zeros: zeros run faster than real data and would flatter the fraction.
    """
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * size**3 * iters / (time.perf_counter() - start) / 1e12
