"""Draft training throughput for an 8B-shaped target on one GPU: tokens/s and fraction of bf16 peak.

    python bench/train_gpu.py                      # hidden 4096, vocab 128256, draft vocab 32000, 7 TTT, seq 2048
    python bench/train_gpu.py --hidden 512 --vocab 8192 --draft-vocab 2048 --seq 256 --device cpu   # shrink

Runs the trainer's own step (target signals from a random lm_head, the TTT unroll, AdamW, clip)
on random synthetic hidden states, so no store or target checkpoint is needed. The bf16 peak is
measured in the same run with a large matmul, and the achieved rate counts the draft's matmul
FLOPs (forward + backward over all TTT steps, attention included) plus the target head's forward.
Prints one JSON line. Needs only torch (and the repository's training/ package).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peak import matmul_peak_tflops, sync as _sync  # noqa: E402

from training.draft import DraftConfig, Eagle3Draft  # noqa: E402
from training.target_head import TargetHead  # noqa: E402
from training.batches import Batch  # noqa: E402
from training.objective import TTTObjective, step_counts, target_signals  # noqa: E402


def train_flops_per_token(cfg: DraftConfig, ttt_steps: int, seq: int) -> float:
    """Return the matmul FLOPs one token costs in a training step (3x forward for the draft)."""
    H, hd = cfg.hidden_size, int(cfg.head_dim)  # type: ignore[arg-type]
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    layer = 2 * H * (q + 2 * kv) + q * H + 3 * H * cfg.intermediate_size + H * cfg.draft_vocab_size
    attn_step0 = 2 * seq * q  # causal QK^T and PV: half of 2 * 2 * seq * q
    attn_later = 4 * seq * q  # later steps compute the full score matrix against step 0
    draft_fwd = 2 * cfg.fused_width * H + ttt_steps * 2 * layer + attn_step0 + (ttt_steps - 1) * attn_later
    return 3 * draft_fwd + 2 * H * cfg.vocab_size  # + the target head's forward (no backward)


def run_bench(
    *,
    hidden: int = 4096,
    heads: int = 32,
    kv_heads: int = 8,
    intermediate: int = 14336,
    vocab: int = 128256,
    draft_vocab: int = 32000,
    ttt_steps: int = 7,
    seq: int = 2048,
    batch: int = 2,
    steps: int = 10,
    warmup: int = 3,
    device: str = "auto",
    peak_n: int = 8192,
    peak_iters: int = 50,
) -> dict[str, Any]:
    """Return throughput figures of draft training steps on synthetic states."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    use_bf16 = dev.type == "cuda"
    dtype = torch.bfloat16 if use_bf16 else torch.float32
    torch.manual_seed(0)
    cfg = DraftConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      intermediate_size=intermediate, vocab_size=vocab, draft_vocab_size=draft_vocab,
                      rope_theta=500000.0, max_position_embeddings=max(seq, 8192))
    draft = Eagle3Draft(cfg)
    draft.load_embeddings(torch.randn(vocab, hidden) * 0.02)
    draft.to(dev).train()
    head = TargetHead((torch.randn(vocab, hidden) * 0.02).to(device=dev, dtype=dtype))
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
    objective = TTTObjective(draft)
    gen = torch.Generator().manual_seed(0)
    cpu_batch = Batch(
        ids=[f"b{i}" for i in range(batch)],
        input_ids=torch.randint(0, vocab, (batch, seq), generator=gen),
        loss_mask=torch.ones(batch, seq, dtype=torch.bool),
        aux=torch.randn(batch, seq, cfg.fused_width, generator=gen),
        final=torch.randn(batch, seq, hidden, generator=gen),
    )
    weights = torch.tensor([0.8**k for k in range(ttt_steps)], dtype=torch.float64)
    scale = (weights / step_counts(cpu_batch.loss_mask, ttt_steps).clamp(min=1)).float().to(dev)

    def one_step() -> float:
        b = cpu_batch.to(dev, dtype)  # host-to-device copy included, as in training
        sig = target_signals(b, head, draft.draft_ids(), draft.t2d)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss, _ = objective(b.input_ids, b.aux, *sig.tensors(), scale, ttt_steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        return float(loss.detach())

    for _ in range(warmup):
        one_step()
    _sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t = time.perf_counter()
    for _ in range(steps):
        last_loss = one_step()
    _sync(dev)
    elapsed = time.perf_counter() - t
    tokens_per_s = batch * seq * steps / elapsed
    achieved = tokens_per_s * train_flops_per_token(cfg, ttt_steps, seq) / 1e12
    peak = matmul_peak_tflops(dev, peak_n, peak_iters)
    return {
        "bench": "draft_train",
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": "bf16-autocast" if use_bf16 else "fp32",
        "hidden": hidden, "vocab": vocab, "draft_vocab": draft_vocab, "ttt_steps": ttt_steps,
        "seq": seq, "batch": batch, "steps": steps,
        "draft_params": sum(p.numel() for p in params),
        "tokens_per_s": tokens_per_s,
        "step_s": elapsed / steps,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "fraction_of_peak": achieved / peak,
        "max_memory_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None,
        "last_loss": last_loss,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--peak-n", type=int, default=8192)
    p.add_argument("--peak-iters", type=int, default=50)
    a = p.parse_args(argv)
    result = run_bench(hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, intermediate=a.intermediate,
                       vocab=a.vocab, draft_vocab=a.draft_vocab, ttt_steps=a.ttt_steps, seq=a.seq, batch=a.batch,
                       steps=a.steps, warmup=a.warmup, device=a.device, peak_n=a.peak_n, peak_iters=a.peak_iters)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
