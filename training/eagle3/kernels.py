"""Optional torch.compile'd forms of the step's memory-bound pieces: RMSNorm and the soft cross-entropy rows,
and (the `fused` switch, issue 39) the TTT attention's merge, the target's signals, SwiGLU and rotary.

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

_state: dict[str, Any] = {"on": False, "fused": False, "compiled": {}}


def enable(on: bool = True, fused: bool | None = None) -> None:
    """Use the compiled forms (on CUDA tensors only) from now on.

    fused: also the TTT attention's merge of block 0 with the diagonals (ttt_merge_*) and the
    target's signals (target_rows); None: with the others. False keeps those eager
    (bench/train_gpu.py's `compiled` path: the step as it was before they were compiled).
    """
    _state["on"] = on
    _state["fused"] = on if fused is None else (on and fused)


def enabled() -> bool:
    return bool(_state["on"])


def fused_enabled(x: torch.Tensor) -> bool:
    """Return whether the TTT merge and the target's signals take their compiled forms for tensors like `x`."""
    return bool(_state["fused"]) and x.is_cuda


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
        (swiglu(x, x) + rotary(x, x, x)).float().sum().backward()
        z = torch.randn(4, 32, device=device, dtype=torch.bfloat16)
        soft_ce_rows(z, torch.randn(4, 32, device=device).softmax(-1), torch.ones(4, device=device),
                     torch.ones((), device=device))
        q = torch.randn(6, 4, 16, device=device, dtype=torch.bfloat16)  # N 6, 4 heads over 2 kv heads, m 2
        ks = torch.randn(6, 2, 2, 16, device=device, dtype=torch.bfloat16)
        y, a0, p = ttt_merge(q, q, torch.randn(4, 6, device=device).t(), ks, ks, 0.25)
        dout0, ds, dks, dvs = ttt_merge_grads(q, y, a0, p, q, ks, ks, 0.25)
        ttt_merge_dq(dout0, ds, ks)
        target_rows(torch.randn(4, 40, device=device, dtype=torch.bfloat16), torch.arange(0, 40, 2, device=device))
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


# --- the TTT attention's merge (training.eagle3.ttt_attention._TTTAttention), compiled only --------
# q, o0, dy, y: (N, nh, hd); lse0t: (N, nh) float32; ks, vs: (N, nkv, m, hd), the keys and values
# of TTT steps 1..m at each query's own origin. The same algebra as the eager merge in
# ttt_attention (small batched matmuls over m <= 7 keys, the rest elementwise); compiled, the
# float32 casts and the elementwise passes around the matmuls fuse. (Written as broadcast sums
# instead of matmuls, the compiler's reductions ran slower than the eager merge on the H200:
# bench/RESULTS.md, issue 39, call 1.)


def _ttt_merge(q: torch.Tensor, o0: torch.Tensor, lse0t: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
               scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, nkv = ks.shape[0], ks.shape[1]
    qg = q.float().view(n, nkv, -1, q.shape[-1])  # (N, nkv, rep, hd)
    s = torch.matmul(qg, ks.float().transpose(-1, -2)) * scale  # (N, nkv, rep, m)
    lse0 = lse0t.float().reshape(n, nkv, -1)
    total = torch.logaddexp(lse0, torch.logsumexp(s, dim=-1))
    a0, p = (lse0 - total).exp(), (s - total[..., None]).exp()
    y = a0[..., None] * o0.float().view_as(qg) + torch.matmul(p, vs.float())
    return y.view_as(q).to(q.dtype), a0, p


def _ttt_merge_grads(dy: torch.Tensor, y: torch.Tensor, a0: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                     ks: torch.Tensor, vs: torch.Tensor, scale: float) -> tuple[torch.Tensor, ...]:
    n, nkv = ks.shape[0], ks.shape[1]
    dyf = dy.float().view(n, nkv, -1, dy.shape[-1])  # (N, nkv, rep, hd)
    delta = (dyf * y.float().view_as(dyf)).sum(-1)  # rowsum(dy * y) of the merged attention
    dout0 = (a0[..., None] * dyf).view_as(dy).to(dy.dtype)
    ds = p * (torch.matmul(dyf, vs.float().transpose(-1, -2)) - delta[..., None]) * scale  # (N, nkv, rep, m)
    dks = torch.matmul(ds.transpose(-1, -2), q.float().view_as(dyf))  # (N, nkv, m, hd)
    dvs = torch.matmul(p.transpose(-1, -2), dyf)
    return dout0, ds, dks.to(ks.dtype), dvs.to(vs.dtype)


def _ttt_merge_dq(dq0: torch.Tensor, ds: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    n, nkv = ks.shape[0], ks.shape[1]
    dq = dq0.float().view(n, nkv, -1, dq0.shape[-1]) + torch.matmul(ds, ks.float())
    return dq.view_as(dq0).to(dq0.dtype)


def ttt_merge(q: torch.Tensor, o0: torch.Tensor, lse0t: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (y, a0, p): block 0's output o0 merged with the diagonal keys/values by the logsumexps."""
    return _pick(_ttt_merge, q)(q, o0, lse0t, ks, vs, scale)


def ttt_merge_grads(dy: torch.Tensor, y: torch.Tensor, a0: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                    ks: torch.Tensor, vs: torch.Tensor, scale: float) -> tuple[torch.Tensor, ...]:
    """Return (block 0's output gradient, score gradients ds, dks, dvs) of the merge."""
    return _pick(_ttt_merge_grads, dy)(dy, y, a0, p, q, ks, vs, scale)


def ttt_merge_dq(dq0: torch.Tensor, ds: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """Return dq: block 0's dq0 plus the diagonals' ds @ ks."""
    return _pick(_ttt_merge_dq, dq0)(dq0, ds, ks)


def _target_rows(logits: torch.Tensor, draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    argmax = logits.argmax(-1)
    p = logits[:, draft_ids].float().softmax(-1)
    entropy = -(p * p.clamp(min=1e-30).log()).sum(-1)
    return argmax, p, entropy


def target_rows(logits: torch.Tensor, draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return the target's (argmax, softmax over the draft vocabulary in float32, its entropy) for logits [n, V]."""
    return _pick(_target_rows, logits)(logits, draft_ids)


# --- SwiGLU and rotary: elementwise, fused when compiled (training steps only, as rms_norm) -------


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Return silu(gate) * up; compiled (with the fused forms on, while training) one pass each way."""
    if _state["fused"] and gate.is_cuda and torch.is_grad_enabled():
        return _pick(_swiglu, gate)(gate, up)
    return _swiglu(gate, up)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Return x * cos + rotate_half(x) * sin (cos, sin broadcast to x and in its dtype)."""
    if _state["fused"] and x.is_cuda and torch.is_grad_enabled():
        return _pick(_rotary, x)(x, cos, sin)
    return _rotary(x, cos, sin)
