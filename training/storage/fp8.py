"""fp8 for stored states: float8_e4m3fn with one float32 scale per token and captured layer.

Each H-wide row is scaled by its own absmax / 448: layers differ in magnitude by orders, so one
scale across them would waste the low layer's precision (the store's layout: training.storage.format).
"""

from __future__ import annotations

import torch

from training.errors import StoreError

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8(x: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (fp8 values [T, n_rows*H], float32 scales [T, n_rows]) for x [T, n_rows*H]."""
    t = x.shape[0]
    rows = x.float().reshape(t, n_rows, x.shape[-1] // n_rows)
    amax = rows.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (rows / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(t, x.shape[-1]), scale


def fp8_rows(x: torch.Tensor, scale: torch.Tensor | None, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (fp8 values, scales) on the host: as given when already quantised, else quantised here."""
    if scale is not None:
        if x.dtype != torch.float8_e4m3fn:
            raise StoreError(f"a sample with fp8 scales must hold float8_e4m3fn values, not {x.dtype}")
        return x.detach().cpu(), scale.detach().cpu().float()
    if x.dtype == torch.float8_e4m3fn:
        raise StoreError("a sample holds fp8 values without their scales")
    return quantize_fp8(x.detach().cpu(), n_rows)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Return values [..., n_rows*H] from fp8 values and their per-row float32 scales [..., n_rows]."""
    rows = q.float().reshape(*scale.shape, q.shape[-1] // scale.shape[-1]) * scale.float().unsqueeze(-1)
    return rows.reshape(q.shape).to(dtype)


