"""Optional torch.compile'd forms of the step's memory-bound pieces: RMSNorm and the soft cross-entropy rows.

Eager, RMSNorm walks its [tokens, H] input about eight times in float32 (upcast, square, mean,
scale, downcast, weight) and the soft cross-entropy walks [tokens, draft_vocab] a dozen times per
TTT step; compiled, each is one or two fused passes. Same formulas, so the values agree with the
eager ones to float rounding (the order of a sum may differ). Off unless `enable()` is called
(bench/train_gpu.py measures both): compiling takes tens of seconds per shape family and needs a
working Triton and C compiler, which a bare node may lack: the trainer calls
`enable_if_working`, which tries them once on a small input and stays eager if they fail.
TRAINING_COMPILE=0 in the environment keeps them off.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

_state: dict[str, Any] = {"on": False, "compiled": {}}


def enable(on: bool = True) -> None:
    """Use the compiled forms (on CUDA tensors only) from now on."""
    _state["on"] = on


def enabled() -> bool:
    return bool(_state["on"])


def enable_if_working(device: torch.device) -> bool:
    """Turn the compiled forms on for a CUDA `device` if they compile and run there; return whether they are on."""
    enable(False)
    if device.type != "cuda" or os.environ.get("TRAINING_COMPILE", "1") == "0":
        return False
    try:
        enable(True)
        x = torch.randn(2, 8, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(64, device=device, requires_grad=True)
        rms_norm(x, w, 1e-5).float().sum().backward()
        z = torch.randn(4, 32, device=device, dtype=torch.bfloat16)
        soft_ce_rows(z, torch.randn(4, 32, device=device).softmax(-1), torch.ones(4, device=device),
                     torch.ones((), device=device))
        torch.cuda.synchronize(device)
        return True
    except Exception as exc:  # noqa: BLE001  (any compiler failure: train eagerly, same results)
        enable(False)
        warnings.warn(f"torch.compile'd training kernels unavailable, running eager: {str(exc)[:200]}", stacklevel=2)
        return False


def _pick(fn: Callable[..., Any], x: torch.Tensor) -> Callable[..., Any]:
    if not _state["on"] or not x.is_cuda:
        return fn
    compiled = _state["compiled"]
    if fn not in compiled:
        compiled[fn] = torch.compile(fn, dynamic=True)
    return compiled[fn]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Return weight * (x / rms(x)), computed in float32 and rounded to x's dtype before the weight."""
    # Compiled for training steps only: decoding after training in the same process (bench/reference,
    # the demo) feeds other strides and shapes every cycle, which recompiled _rms_norm to the limit on
    # the H200 and made `eval` 1.8x slower. (Not in _pick: soft_ce_rows runs inside an autograd
    # Function's forward, where grad is always off, and must stay compiled.)
    fn = _pick(_rms_norm, x) if torch.is_grad_enabled() else _rms_norm
    return fn(x, weight, eps)


def _soft_ce_rows(
    z: torch.Tensor, p: torch.Tensor, w: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    log_q = torch.log_softmax(z.float(), dim=-1)
    p = p.float()
    w = w.float()
    loss = (-(p * log_q).sum(-1) * w).sum()
    grad = (log_q.exp() * p.sum(-1, keepdim=True) - p) * (w * scale.float())[:, None]
    return loss, grad.to(z.dtype)


def soft_ce_rows(
    z: torch.Tensor, p: torch.Tensor, w: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (sum_t w_t * soft-CE(p_t, z_t), its gradient scaled by `scale`, in z's dtype) for rows z [n, V]."""
    return _pick(_soft_ce_rows, z)(z, p, w, scale)


def loss_rows(z: torch.Tensor, p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Return sum_t w_t * soft-CE(p_t, z_t) alone (no gradient wanted)."""
    return (-(p.float() * torch.log_softmax(z.float(), dim=-1)).sum(-1) * w.float()).sum()
