"""Training-time-test attention as one fused computation over packed sequences.

At TTT step k, the query of chain origin t sees the step-0 keys of its own sample at positions
<= t (causal) and the keys of steps 1..k at origin t only (see draft.TTTCache, the reference).
draft.TTTCache builds that as a [T, T + k] score matrix per head and step: quadratic memory,
several passes over it, and it cannot mix samples in one row. Here the two parts are computed
apart and merged exactly, as flash attention merges its own blocks:

    block 0: (o0, lse0) = causal attention of q over the step-0 keys, per sample (varlen flash)
    diagonal: s_j = scale * q . k_j for j = 1..k   (one score per query and step)
    L = logsumexp(lse0, s_1..s_k);  y = exp(lse0 - L) o0 + sum_j exp(s_j - L) v_j

which is softmax attention over the same keys, so the values match the reference to rounding.
The backward is the same attention's backward: block 0 goes through the flash kernel's own
backward given grad exp(lse0 - L) dy and the merged output y (its row term rowsum(dout * out)
then equals the merged attention's), the diagonal terms are elementwise.

Tokens are packed: q/k/v are [N, heads, head_dim] over all samples of a micro-batch laid end to
end, `cu_seqlens` [S + 1] int32 their boundaries. On CUDA with bf16/fp16 block 0 is PyTorch's
varlen flash kernel; elsewhere (CPU tests, fp32 runs) an exact per-sample reference with the
same forward/backward contract.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from training.eagle3 import kernels
from training.runtime.profiling import phase


class Block0:
    """Causal attention per packed sample, returning its logsumexp and taking the flash backward."""

    def __init__(self, cu_seqlens: torch.Tensor, bounds: list[int], max_len: int, scale: float) -> None:
        self.cu_seqlens = cu_seqlens  # [S + 1] int32 on the tensors' device
        self.bounds = bounds  # the same boundaries as host ints (no device sync to read them)
        self.max_len = max_len
        self.scale = scale

    @staticmethod
    def uses_flash(q: torch.Tensor) -> bool:
        return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Return (out [N, nh, hd], lse [nh, N] float32, state for backward)."""
        if self.uses_flash(q):
            out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
                q, k, v, self.cu_seqlens, self.cu_seqlens, self.max_len, self.max_len, 0.0, True, False,
                scale=self.scale)
            return out, lse, (rng, unused)
        outs, lses = [], []
        for s, e in zip(self.bounds[:-1], self.bounds[1:]):
            probs, lse = self._probs(q[s:e], k[s:e])
            outs.append((probs @ _heads_first(v[s:e], q.shape[1]).float()).transpose(0, 1))  # (L, nh, hd)
            lses.append(lse)
        return torch.cat(outs).to(q.dtype), torch.cat(lses, dim=1), None

    def backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, state: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (dq, dk, dv) as flash attention's backward: dS = P * (dout V^T - rowsum(dout * out))."""
        if self.uses_flash(q):
            rng, unused = state
            dq, dk, dv = torch.ops.aten._flash_attention_backward(
                dout.contiguous(), q, k, v, out, lse, self.cu_seqlens, self.cu_seqlens, self.max_len,
                self.max_len, 0.0, True, rng, unused, scale=self.scale)
            return dq, dk, dv
        nh, nkv = q.shape[1], k.shape[1]
        dqs, dks, dvs = [], [], []
        for s, e in zip(self.bounds[:-1], self.bounds[1:]):
            probs, _ = self._probs(q[s:e], k[s:e], lse[:, s:e])  # (nh, L, L)
            do, o = dout[s:e].float().transpose(0, 1), out[s:e].float().transpose(0, 1)  # (nh, L, hd)
            dp = do @ _heads_first(v[s:e], nh).float().transpose(1, 2)
            ds = probs * (dp - (do * o).sum(-1, keepdim=True))
            dqs.append((ds @ _heads_first(k[s:e], nh).float()).transpose(0, 1) * self.scale)
            dks.append(_sum_groups((ds.transpose(1, 2) @ q[s:e].float().transpose(0, 1)) * self.scale, nkv))
            dvs.append(_sum_groups(probs.transpose(1, 2) @ do, nkv))
        return torch.cat(dqs).to(q.dtype), torch.cat(dks).to(k.dtype), torch.cat(dvs).to(v.dtype)

    def _probs(
        self, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (causal softmax probabilities (nh, L, L) float32, their logsumexp (nh, L))."""
        scores = (q.float().transpose(0, 1) @ _heads_first(k, q.shape[1]).float().transpose(1, 2)) * self.scale
        n = q.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1) if lse is None else lse.float()
        return (scores - lse[..., None]).exp(), lse


def _heads_first(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Return (L, nkv, hd) -> (nh, L, hd), kv heads repeated for grouped-query attention."""
    return x.repeat_interleave(n_heads // x.shape[1], dim=1).transpose(0, 1)


def _sum_groups(x: torch.Tensor, n_kv: int) -> torch.Tensor:
    """Return per-query-head grads (nh, L, hd) summed onto their kv heads: (L, nkv, hd)."""
    nh, n, hd = x.shape
    return x.view(n_kv, nh // n_kv, n, hd).sum(1).transpose(0, 1)


def _grouped(x: torch.Tensor, n_kv: int) -> torch.Tensor:
    """Return (N, nh, ...) float32 viewed as (N, nkv, nh // nkv, ...): query heads by the kv head they read."""
    return x.float().view(x.shape[0], n_kv, x.shape[1] // n_kv, *x.shape[2:])


class _TTTAttention(torch.autograd.Function):
    """Block 0 by flash attention, the diagonals of steps 1..m as small batched products per token."""

    @staticmethod
    def forward(ctx: Any, block0: Block0, m: int, q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor,
                *later: torch.Tensor) -> torch.Tensor:
        o0, lse0, state = block0.forward(q, k0, v0)
        ctx.block0, ctx.m, ctx.state = block0, m, state
        if m == 0:
            ctx.save_for_backward(q, k0, v0, o0, lse0)
            return o0
        n_kv = k0.shape[1]
        if kernels.fused_enabled(q):  # the same algebra, compiled into a few passes
            ks, vs = torch.stack(later[:m], dim=2), torch.stack(later[m:], dim=2)  # (N, nkv, m, hd)
            y, a0, p = kernels.ttt_merge(q, o0, lse0.t(), ks, vs, block0.scale)
            ctx.save_for_backward(q, k0, v0, y, lse0, a0, p, *later)
            return y
        ks = torch.stack(later[:m], dim=2).float()  # (N, nkv, m, hd)
        vs = torch.stack(later[m:], dim=2).float()
        s = torch.matmul(_grouped(q, n_kv), ks.transpose(-1, -2)) * block0.scale  # (N, nkv, rep, m)
        lse0_g = _grouped(lse0.t(), n_kv)  # (N, nkv, rep)
        total = torch.logaddexp(lse0_g, torch.logsumexp(s, dim=-1))
        a0, p = (lse0_g - total).exp(), (s - total[..., None]).exp()
        y = a0[..., None] * _grouped(o0, n_kv) + torch.matmul(p, vs)  # (N, nkv, rep, hd)
        y = y.view_as(q).to(q.dtype)
        ctx.save_for_backward(q, k0, v0, y, lse0, a0, p, *later)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        block0, m = ctx.block0, ctx.m
        if m == 0:
            q, k0, v0, out, lse0 = ctx.saved_tensors
            dq, dk0, dv0 = block0.backward(dy, q, k0, v0, out, lse0, ctx.state)
            return None, None, dq, dk0, dv0
        q, k0, v0, y, lse0, a0, p, *later = ctx.saved_tensors
        n_kv = k0.shape[1]
        if kernels.fused_enabled(q):
            ks, vs = torch.stack(later[:m], dim=2), torch.stack(later[m:], dim=2)
            dout0, ds, dks, dvs = kernels.ttt_merge_grads(dy, y, a0, p, q, ks, vs, block0.scale)
            dq0, dk0, dv0 = block0.backward(dout0, q, k0, v0, y, lse0, ctx.state)
            dq = kernels.ttt_merge_dq(dq0, ds, ks)
            return (None, None, dq, dk0, dv0, *dks.unbind(2), *dvs.unbind(2))
        dyf = _grouped(dy, n_kv)  # (N, nkv, rep, hd)
        delta = (dyf * _grouped(y, n_kv)).sum(-1)  # (N, nkv, rep): rowsum(dy * y) of the merged attention
        dout0 = (a0[..., None] * dyf).view_as(dy).to(dy.dtype)
        dq0, dk0, dv0 = block0.backward(dout0, q, k0, v0, y, lse0, ctx.state)
        ks = torch.stack(later[:m], dim=2).float()  # (N, nkv, m, hd)
        vs = torch.stack(later[m:], dim=2).float()
        ds = p * (torch.matmul(dyf, vs.transpose(-1, -2)) - delta[..., None]) * block0.scale  # (N, nkv, rep, m)
        dq = _grouped(dq0, n_kv) + torch.matmul(ds, ks)
        dks = torch.matmul(ds.transpose(-1, -2), _grouped(q, n_kv))  # (N, nkv, m, hd)
        dvs = torch.matmul(p.transpose(-1, -2), dyf)
        grads_k = [g.to(k0.dtype) for g in dks.unbind(2)]
        grads_v = [g.to(v0.dtype) for g in dvs.unbind(2)]
        return (None, None, dq.view_as(q).to(q.dtype), dk0, dv0, *grads_k, *grads_v)


class PackedTTTCache:
    """The TTT steps' keys and values over a packed row: the draft.Cache that TTT training uses.

    Same attention as draft.TTTCache (step 0 causal within each sample, step k adds the keys of
    steps 1..k at the query's own origin), for a batch of one packed row [1, N] whose samples
    `cu_seqlens` delimits.
    """

    def __init__(self, cu_seqlens: torch.Tensor, bounds: list[int], max_len: int) -> None:
        self.cu_seqlens = cu_seqlens
        self.bounds = bounds
        self.max_len = max_len
        self.keys: list[torch.Tensor] = []  # per step: (N, nkv, hd)
        self.values: list[torch.Tensor] = []

    def position_offset(self) -> int:
        """Return the step index: step k puts origin t at position t + k."""
        return len(self.keys)

    def upto(self, steps: int) -> PackedTTTCache:
        """Return a cache holding this one's first `steps` steps (new steps go to it alone).

        What a recomputed TTT step attends over: in the backward this cache holds every step, and
        step k must see steps < k only, as it did in the forward.
        """
        view = PackedTTTCache(self.cu_seqlens, self.bounds, self.max_len)
        view.keys, view.values = self.keys[:steps], self.values[:steps]
        return view

    def newest(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the keys and values (N, nkv, hd) of the last step appended."""
        return self.keys[-1], self.values[-1]

    def keep(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append a step's keys and values computed through a view (see `upto`)."""
        self.keys.append(keys)
        self.values.append(values)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append this step's k, v (1, nkv, N, hd); return attention of q (1, nh, N, hd) as (1, nh, N, hd)."""
        if q.shape[0] != 1:
            raise ValueError(f"PackedTTTCache takes one packed row, got a batch of {q.shape[0]}")
        qn = q[0].transpose(0, 1).contiguous()  # (N, nh, hd)
        kn, vn = k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()  # (N, nkv, hd)
        self.keys.append(kn)
        self.values.append(vn)
        block0 = Block0(self.cu_seqlens, self.bounds, self.max_len, 1.0 / math.sqrt(q.shape[-1]))
        m = len(self.keys) - 1
        with phase("attention"):
            y = _TTTAttention.apply(block0, m, qn, self.keys[0], self.values[0], *self.keys[1:], *self.values[1:])
        return y.transpose(0, 1)[None]  # (1, nh, N, hd)
