"""The soft cross-entropy of the draft's logits against the target's distribution, gradient made in the forward.

loss_sum = sum_t w_t * -(sum_v p_tv * log_softmax(z_t)_v), trained as scale * loss_sum, with z
the draft's logits (bf16 under autocast) and p the target's distribution over the draft
vocabulary. Written plainly, autograd keeps a float32 copy of the logits and of their log-softmax
for every TTT step, and walks the [positions, vocab] tensor several times forward and back. The
gradient is scale * w_t * (softmax(z_t) * sum_v p_tv - p_t): this module computes it in the
forward, a chunk of rows at a time, and keeps only that gradient (in the logits' dtype).
Same formula as the plain version, operation for operation, so the values match it to rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from training.eagle3 import kernels

ROWS_PER_CHUNK = 2048  # bounds the float32 temporaries to ROWS x vocab
# The compiled pass's temporaries too: one chunk at the benchmark's shapes, and a 64K-token row
# at a 32K vocabulary no longer needs [64K, 32K] float32 at once.
COMPILED_ROWS_PER_CHUNK = 16384


class _SoftCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, probs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        need_grad = ctx.needs_input_grad[0]
        grad = None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            compiled = need_grad and kernels.enabled() and logits.is_cuda
            # compiled: one fused pass per chunk; eager: chunks bound the float32 temporaries
            rows = COMPILED_ROWS_PER_CHUNK if compiled else ROWS_PER_CHUNK
            if compiled and logits.shape[0] <= rows:
                total, grad = kernels.soft_ce_rows(logits, probs, weight, scale)
            else:
                grad = torch.empty_like(logits) if need_grad else None
                for s in range(0, logits.shape[0], rows):
                    z, p, w = (x[s : s + rows] for x in (logits, probs, weight))
                    if grad is None:
                        total = total + kernels.loss_rows(z, p, w)
                        continue
                    # scaled in float32 before rounding, as autograd would round the plain version's
                    part, grad[s : s + rows] = kernels.soft_ce_rows(z, p, w, scale)
                    total = total + part
        ctx.save_for_backward(grad if grad is not None else torch.empty(0))
        ctx.mark_non_differentiable(total)
        return total * scale.float(), total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, _: Any) -> tuple[Any, ...]:
        (grad,) = ctx.saved_tensors
        return grad * grad_out.to(grad.dtype), None, None, None  # grad_out is 1 in training: exact


def soft_cross_entropy_sum(
    logits: torch.Tensor, probs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (scale * loss_sum, loss_sum): loss_sum = sum_t weight_t * soft-CE(probs_t, logits_t), float32.

    logits [n, V], probs [n, V], weight [n], scale a 0-dim tensor. Only the first output carries a
    gradient; the second is the metric.
    """
    return _SoftCE.apply(logits, probs, weight, scale)
