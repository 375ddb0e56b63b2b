"""Draft training throughput for an 8B-shaped target on one GPU: tokens/s and fraction of bf16 peak, old and new path.

    python bench/train_gpu.py                      # hidden 4096, vocab 128256, draft vocab 32000, 7 TTT, seq 2048
    python bench/train_gpu.py --path old           # the padded TTTObjective path as it was (before issue #28)
    python bench/train_gpu.py --all --path all --out-dir DIR  # + compiled path, GPU check, profile, real lengths
    python bench/train_gpu.py --tiny --all         # the same logic at toy sizes on the CPU
    python bench/train_gpu.py --path compiled,fused --profile   # issue 39's before/after, one run
    python bench/train_gpu.py --long 16384,32768,65536 --long-recompute off,on,auto  # Kimi-shaped long rows

Runs the trainer's own step (target signals from a random lm_head, the TTT unroll, AdamW, clip)
on random synthetic hidden states, so no store or target checkpoint is needed. The bf16 peak is
measured in the same run with a large matmul, and the achieved rate counts the draft's matmul
FLOPs (forward + backward over all TTT steps, attention counted as the full score matrix for
steps >= 1) plus the target head's forward, per useful token, for both paths alike.

Paths: `old` is the padded path exactly as it ran before (fp32 host batch copied in the step,
TTTObjective, foreach AdamW, a loss read back every step); `new` is what training.train.trainer runs
now (packed rows, PackedTTTObjective, pinned host batch copied on a side stream one step ahead,
fused AdamW, no host sync in the step); `compiled` is `new` with training.eagle3.kernels enabled
(torch.compile'd RMSNorm and soft cross-entropy rows), as the trainer runs on CUDA when they
compile and work there (training.eagle3.kernels.enable_if_working); `new` keeps them off; `fused`
(issue 39) is `compiled` with kernels' fused forms too (the TTT attention's merge, the target's
signals, SwiGLU, rotary), which is what the trainer now runs; `compiled` stays selectable as the
step before it.

--long L1,L2,...: one row of L tokens per step at a Kimi-shaped draft (hidden 7168, target vocab
163,840, draft vocab 32,000, TTT 7; --long-shape bench uses the --hidden etc. given), with each
--long-recompute mode (PackedTTTObjective's: off, on, auto or a number of steps): peak memory,
useful tokens/s and the fraction of peak at the causal FLOP count (causal_train_flops_per_token).

--all adds: `check` (on the GPU, old and new path in bf16 against the old path in float32 on
packed samples of several lengths: loss and gradient errors); `profile` (torch.profiler of one
step per path, GPU time sorted into the phases of training.runtime.profiling plus backward kinds,
host-to-device copy, optimizer and idle gaps, each with its share of the step and its own
fraction of peak); `real` (lengths like a real mix, mean ~2.1K with a tail past 16K, as the
trainer batches them: old = padded micro-batches of micro_batch_size, new = packed; useful
tokens/s). Prints one JSON line (last), and with --out-dir writes it and a text table there.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peak import matmul_peak_tflops, sync as _sync  # noqa: E402
from bench.simulate_bench import MemoryStates  # noqa: E402

from training.feed.batches import Batch, Prefetcher, epoch_batches, load_batch  # noqa: E402
from training.eagle3 import kernels  # noqa: E402
from training.eagle3.model import DraftConfig, Eagle3Draft  # noqa: E402
from training.eagle3.objective import (  # noqa: E402
    N_SUMS, PackedTTTObjective, TTTObjective, packed_call, packed_target_signals, step_counts, target_signals,
)
from training.feed.packing import DeviceCopier, from_padded, pack_samples, plan_micro_batches  # noqa: E402
from training.runtime.profiling import PREFIX, phase  # noqa: E402
from training.storage.format import HiddenStateSample  # noqa: E402
from training.target.head import TargetHead  # noqa: E402

# compiled: new + training.eagle3.kernels (torch.compile'd RMSNorm and soft CE), the TTT attention's merge eager
# (the step of issue 28, 58.7% of peak); fused: compiled + the merge compiled too (issue 39), what the trainer runs
PATHS = ("old", "new", "compiled", "fused")


class Shape(NamedTuple):  # not a dataclass: the tests load this file without registering a module
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    vocab: int = 128256
    draft_vocab: int = 32000
    ttt_steps: int = 7
    seq: int = 2048
    batch: int = 2

    def config(self, max_positions: int = 8192) -> DraftConfig:
        return DraftConfig(hidden_size=self.hidden, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                           intermediate_size=self.intermediate, vocab_size=self.vocab,
                           draft_vocab_size=self.draft_vocab, rope_theta=500000.0,
                           max_position_embeddings=max(self.seq, max_positions))


TINY = Shape(hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512, draft_vocab=128, ttt_steps=3, seq=48,
             batch=2)


def layer_flops(cfg: DraftConfig) -> tuple[float, float, float]:
    """Return matmul FLOPs per token of (one TTT step's layer + lm_head, fc, attention per unit of sequence).

    Attention: 4 * q FLOPs per (query, key) pair for QK^T and PV.
    """
    H, hd = cfg.hidden_size, int(cfg.head_dim)  # type: ignore[arg-type]
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    layer = 2 * H * (q + 2 * kv) + q * H + 3 * H * cfg.intermediate_size + H * cfg.draft_vocab_size
    return 2.0 * layer, 2.0 * cfg.fused_width * H, 4.0 * q


def train_flops_per_token(cfg: DraftConfig, ttt_steps: int, seq: int) -> float:
    """Return the matmul FLOPs one token costs in a training step (3x forward for the draft).

    The count the benchmark has always used: step 0's attention over half the (causal) sequence,
    later steps' over the whole of it (the score matrix the padded path computes).
    """
    layer, fc, attn = layer_flops(cfg)
    draft_fwd = fc + ttt_steps * layer + attn * seq / 2 + (ttt_steps - 1) * attn * seq
    return 3 * draft_fwd + 2 * cfg.hidden_size * cfg.vocab_size  # + the target head's forward (no backward)


def causal_train_flops_per_token(cfg: DraftConfig, ttt_steps: int, seq: int) -> float:
    """Return the matmul FLOPs one token costs when attention is counted as the packed path computes it.

    Every TTT step's block 0 is causal flash attention over the step-0 keys (half the score
    matrix); the TTT diagonals are k products per query (negligible). Recomputed steps are not
    counted: this is the useful work. At 2K tokens it is within 2% of train_flops_per_token; at 64K
    the latter counts twice the attention the packed path does.
    """
    layer, fc, attn = layer_flops(cfg)
    draft_fwd = fc + ttt_steps * layer + ttt_steps * attn * seq / 2
    return 3 * draft_fwd + 2 * cfg.hidden_size * cfg.vocab_size


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _build(shape: Shape, dev: torch.device, path: str, max_positions: int = 8192):
    kernels.enable(path in ("compiled", "fused"), fused=path == "fused")
    torch.manual_seed(0)
    cfg = shape.config(max_positions)
    with dev:  # weights drawn where they live: seconds, not tens of seconds, at 8B shapes
        draft = Eagle3Draft(cfg)
        draft.load_embeddings(torch.randn(shape.vocab, shape.hidden) * 0.02)
        draft.train()
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        head = TargetHead((torch.randn(shape.vocab, shape.hidden) * 0.02).to(dtype))
    params = [p for p in draft.parameters() if p.requires_grad]
    fused = path != "old" and dev.type == "cuda"
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0, fused=fused)
    return cfg, draft, head, params, opt


def _synthetic_batch(shape: Shape, dtype: torch.dtype = torch.float32) -> Batch:
    """Return one random batch; `dtype` bf16 halves the host copy of long rows (the store's own dtype)."""
    gen = torch.Generator().manual_seed(0)
    B, T = shape.batch, shape.seq
    return Batch(
        ids=[f"b{i}" for i in range(B)],
        input_ids=torch.randint(0, shape.vocab, (B, T), generator=gen),
        loss_mask=torch.ones(B, T, dtype=torch.bool),
        aux=torch.randn(B, T, 3 * shape.hidden, generator=gen).to(dtype),
        final=torch.randn(B, T, shape.hidden, generator=gen).to(dtype),
    )


def _scale(counts: torch.Tensor, ttt: int, dev: torch.device) -> torch.Tensor:
    weights = torch.tensor([0.8**k for k in range(ttt)], dtype=torch.float64)
    return (weights / counts.clamp(min=1)).float().to(dev)


def make_step(path: str, shape: Shape, dev: torch.device, draft: Eagle3Draft, head: TargetHead, params: list,
              opt: torch.optim.Optimizer, *, recompute: bool | int | None = False,
              host_dtype: torch.dtype = torch.float32) -> Callable[[], torch.Tensor | float]:
    """Return one training step at the benchmark's shape on `path`; it returns the loss.

    recompute: PackedTTTObjective's (False: keep every TTT step's activations, as before; True:
    recompute all but the last in the backward; an int: that many; None: as many as the row's
    length and the free memory call for).
    """
    use_bf16 = dev.type == "cuda"
    dtype = torch.bfloat16 if use_bf16 else torch.float32
    cpu_batch, ttt = _synthetic_batch(shape, host_dtype), shape.ttt_steps
    scale = _scale(step_counts(cpu_batch.loss_mask, ttt), ttt, dev)

    def finish(loss: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with phase("backward"):
            loss.backward()
        with phase("clip"):
            torch.nn.utils.clip_grad_norm_(params, 0.5)
        with phase("optimizer"):
            opt.step()

    if path == "old":
        objective = TTTObjective(draft)

        def old_step() -> float:
            with phase("h2d"):
                b = cpu_batch.to(dev, dtype)  # host-to-device copy included, as in training
            with phase("target"):
                sig = target_signals(b, head, draft.draft_ids(), draft.t2d)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss, _ = objective(b.input_ids, b.aux, *sig.tensors(), scale, ttt)
            finish(loss)
            return float(loss.detach())

        return old_step

    packed_objective = PackedTTTObjective(draft, recompute=recompute)
    host = from_padded(cpu_batch).pin_memory()
    copier = DeviceCopier(dev, dtype)
    moving = [copier.start(host)]

    def new_step() -> torch.Tensor:
        with phase("h2d"):
            b = copier.wait(moving[0])
            moving[0] = copier.start(host)  # the next step's batch, copied while this one computes
        with phase("target"):
            sig = packed_target_signals(b, head, draft.draft_ids(), draft.t2d)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss, _ = packed_call(packed_objective, b, sig, scale, ttt)
        finish(loss)
        return loss.detach()

    return new_step


def _release(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def shape_bench(path: str, shape: Shape, dev: torch.device, steps: int, warmup: int, peak: float) -> dict[str, Any]:
    """Return throughput, fraction of peak and memory of `path` at the benchmark's fixed shape."""
    cfg, draft, head, params, opt = _build(shape, dev, path)
    step = make_step(path, shape, dev, draft, head, params, opt)
    for _ in range(warmup):
        step()
    _sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t = time.perf_counter()
    for _ in range(steps):
        last = step()
    _sync(dev)
    elapsed = time.perf_counter() - t
    tokens_per_s = shape.batch * shape.seq * steps / elapsed
    achieved = tokens_per_s * train_flops_per_token(cfg, shape.ttt_steps, shape.seq) / 1e12
    out = {
        "path": path, "tokens_per_s": tokens_per_s, "step_s": elapsed / steps, "achieved_tflops": achieved,
        "fraction_of_peak": achieved / peak,
        "max_memory_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None,
        "last_loss": float(last), "draft_params": sum(p.numel() for p in params),
    }
    del draft, head, params, opt, step
    _release(dev)
    return out


# --- long context: one sample of L tokens per step ----------------------------------------------

KIMI = Shape(hidden=7168, heads=56, kv_heads=8, intermediate=18432, vocab=163840, draft_vocab=32000, ttt_steps=7,
             seq=16384, batch=1)  # head_dim 128; the target's hidden and vocabulary, a Llama draft layer


def long_bench(path: str, shape: Shape, dev: torch.device, recompute: bool | int | None, steps: int, warmup: int,
               peak: float) -> dict[str, Any]:
    """Return peak memory, tokens/s and fraction of peak for one row of `shape.seq` tokens per step.

    All tokens are useful (one whole sample, no padding); the fraction of peak counts FLOPs as
    causal_train_flops_per_token does, and the step's own time (recomputation included).
    """
    cfg, draft, head, params, opt = _build(shape, dev, path, max_positions=shape.seq)
    host_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    step = make_step(path, shape, dev, draft, head, params, opt, recompute=recompute, host_dtype=host_dtype)
    # what recompute=None (the trainer's default) decides for this row, with the weights and batch in place
    auto = PackedTTTObjective(draft).recomputed_steps(shape.seq, shape.ttt_steps, dev)
    chosen = PackedTTTObjective(draft, recompute=recompute).recomputed_steps(shape.seq, shape.ttt_steps, dev)
    try:
        for _ in range(warmup):
            step()
        _sync(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t = time.perf_counter()
        for _ in range(steps):
            last = step()
        _sync(dev)
        elapsed = time.perf_counter() - t
    finally:
        del step
    tokens_per_s = shape.batch * shape.seq * steps / elapsed
    achieved = tokens_per_s * causal_train_flops_per_token(cfg, shape.ttt_steps, shape.seq) / 1e12
    out = {
        "path": path, "seq": shape.seq, "recompute": "auto" if recompute is None else recompute,
        "recomputed_steps": chosen, "auto_recomputed_steps": auto, "useful_tokens_per_s": tokens_per_s, "step_s": elapsed / steps,
        "achieved_tflops": achieved, "fraction_of_peak": achieved / peak,
        "max_memory_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None,
        "max_reserved_gb": torch.cuda.max_memory_reserved(dev) / 1e9 if dev.type == "cuda" else None,
        "last_loss": float(last), "draft_params": sum(p.numel() for p in params),
    }
    del draft, head, params, opt
    _release(dev)
    return out


# --- profile: where one step's time goes -------------------------------------------------------


def _phase_flops(cfg: DraftConfig, shape: Shape) -> dict[str, float]:
    """Return the matmul FLOPs of each phase of one step, as train_flops_per_token counts them."""
    tokens, seq, ttt = shape.batch * shape.seq, shape.seq, shape.ttt_steps
    layer, fc, attn = layer_flops(cfg)
    out = {"target": 2.0 * cfg.hidden_size * cfg.vocab_size * tokens, "loss": 0.0, "h2d": 0.0, "clip": 0.0,
           "optimizer": 0.0}
    fwd = 0.0
    for k in range(ttt):
        a = attn * (seq / 2 if k == 0 else seq) * tokens
        out[f"draft_step{k}"] = (layer + (fc if k == 0 else 0.0)) * tokens
        out["attention"] = out.get("attention", 0.0) + a
        fwd += out[f"draft_step{k}"] + a
    out["backward"] = 2 * fwd
    return out


# The CUDA runtime's mark for the host waiting on a full launch queue (the GPU is behind, as it
# should be): it shows up in the profile with a duration, as an event or a kernel, but is no GPU work.
IDLE_MARK = "Command Buffer Full"


def _category(evt: Any) -> str:
    e = evt
    while e is not None:
        name = e.name
        if name.startswith(PREFIX):
            return name[len(PREFIX):]
        if name.startswith("autograd::engine::evaluate_function"):
            return "backward"
        e = e.cpu_parent
    return "other"


def _backward_kind(evt: Any) -> str | None:
    """Return what a backward kernel's op differentiates (matmul, attention, loss, elementwise), or None."""
    e = evt
    while e is not None:
        name = e.name
        if name.startswith("autograd::engine::evaluate_function"):
            fn = name.split(":")[-1].strip()
            if fn.startswith(("Mm", "Addmm", "Bmm", "Matmul", "Linear")):
                return "backward:matmul"
            if "Attention" in fn or fn.startswith("_TTTAttention"):
                return "backward:attention"
            if "SoftCE" in fn or "LogSoftmax" in fn:
                return "backward:loss"
            return "backward:other"
        e = e.cpu_parent
    return None


def profile_step(path: str, shape: Shape, dev: torch.device, peak: float, out_dir: Path | None) -> dict[str, Any]:
    """Return one profiled step's GPU time per phase: ms, share of the step, own fraction of peak."""
    from torch.profiler import ProfilerActivity, profile

    cfg, draft, head, params, opt = _build(shape, dev, path)
    step = make_step(path, shape, dev, draft, head, params, opt)
    for _ in range(3):
        step()
    _sync(dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        step()
        _sync(dev)
        wall_ms = (time.perf_counter() - t0) * 1e3
    times: dict[str, float] = defaultdict(float)
    kinds: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if not str(evt.device_type).endswith("CPU") or evt.name == IDLE_MARK:
            continue  # a kernel's own event: its time is counted on the host event that launched it
        # on the CPU (the --tiny test) the ops' own host time stands in for kernel time
        us = (sum(k.duration for k in evt.kernels if k.name != IDLE_MARK) if dev.type == "cuda"
              else evt.self_cpu_time_total)
        if not us:
            continue
        times[_category(evt)] += us / 1e3
        kind = _backward_kind(evt)
        if kind:
            kinds[kind] += us / 1e3
    busy = sum(times.values())
    flops = _phase_flops(cfg, shape)
    rows = {}
    steps_ms = sum(v for k, v in times.items() if k.startswith("draft_step"))
    merged = dict(times)
    merged["draft_forward (all steps)"] = steps_ms
    for name, ms in sorted(merged.items(), key=lambda kv: -kv[1]):
        f = flops.get(name, sum(v for k, v in flops.items() if k.startswith("draft_step"))
                      if name.startswith("draft_forward") else 0.0)
        rows[name] = {"ms": ms, "share": ms / wall_ms, "fraction_of_peak": (f / (ms / 1e3) / 1e12 / peak) if ms and f
                      else 0.0}
    rows["idle (wall - kernel time)"] = {"ms": max(0.0, wall_ms - busy), "share": max(0.0, wall_ms - busy) / wall_ms,
                                         "fraction_of_peak": 0.0}
    result = {"path": path, "wall_ms": wall_ms, "kernel_ms": busy, "phases": rows,
              "backward_kinds_ms": dict(sorted(kinds.items(), key=lambda kv: -kv[1]))}
    if out_dir is not None:
        try:
            table = prof.key_averages().table(sort_by="self_cuda_time_total" if dev.type == "cuda"
                                              else "self_cpu_time_total", row_limit=45)
        except Exception as exc:  # noqa: BLE001  (the table is a record only)
            table = f"(no table: {exc})"
        (out_dir / f"profile-{path}.txt").write_text(table)
    del draft, head, params, opt, step, prof
    _release(dev)
    return result


# --- GPU check: the new path computes what the old one does ------------------------------------


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def equivalence_check(dev: torch.device) -> dict[str, Any]:
    """Return loss/gradient errors of old-bf16, new-bf16 and new-fp32 against old-fp32 on packed samples."""
    shape = Shape(hidden=512, heads=8, kv_heads=2, intermediate=1024, vocab=4096, draft_vocab=1024, ttt_steps=4)
    lengths = [700, 1300, 290, 512]
    cfg = shape.config()
    gen = torch.Generator().manual_seed(3)
    samples = []
    for i, n in enumerate(lengths):
        mask = torch.ones(n, dtype=torch.bool)
        mask[: n // 4] = False
        samples.append(HiddenStateSample(id=f"s{i}", input_ids=torch.randint(0, shape.vocab, (n,), generator=gen),
                                         loss_mask=mask, aux=torch.randn(n, 3 * shape.hidden, generator=gen),
                                         final=torch.randn(n, shape.hidden, generator=gen)))
    store = MemoryStates(samples)
    ids = [s.id for s in samples]
    T = max(lengths)
    padded = load_batch(store, ids, T)
    packed = pack_samples(store, ids, T)
    ttt = shape.ttt_steps
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    draft.load_embeddings(torch.randn(shape.vocab, shape.hidden) * 0.02)
    draft.to(dev).train()
    head_w = torch.randn(shape.vocab, shape.hidden, device=dev) * 0.05
    scale = _scale(step_counts(padded.loss_mask, ttt), ttt, dev)

    def run(path: str, bf16: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dtype = torch.bfloat16 if bf16 else torch.float32
        head = TargetHead(head_w.to(dtype))
        draft.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            if path == "old":
                b = padded.to(dev, dtype)
                sig = target_signals(b, head, draft.draft_ids(), draft.t2d)
                loss, _ = TTTObjective(draft)(b.input_ids, b.aux, *sig.tensors(), scale, ttt)
            else:
                pb = packed.to(dev, dtype)
                sig = packed_target_signals(pb, head, draft.draft_ids(), draft.t2d)
                objective = PackedTTTObjective(draft, recompute=path.endswith("+recompute"))
                loss, _ = packed_call(objective, pb, sig, scale, ttt)
        loss.backward()
        return loss.detach(), {n: p.grad.detach().clone() for n, p in draft.named_parameters() if p.grad is not None}

    runs = {"old_fp32": run("old", False)}
    variants = [("new_fp32", "new", False)]
    if dev.type == "cuda":
        variants += [("old_bf16", "old", True), ("new_bf16", "new", True), ("compiled_bf16", "compiled", True),
                     ("fused_bf16", "fused", True), ("fused_recompute_bf16", "fused+recompute", True)]
    for name, path, bf16 in variants:
        kernels.enable(path.startswith(("compiled", "fused")), fused=path.startswith("fused"))
        runs[name] = run(path, bf16)
        kernels.enable(False)
    out: dict[str, Any] = {"lengths": lengths, "ttt_steps": ttt}
    pairs = [("new_fp32", "old_fp32"), ("old_bf16", "old_fp32"), ("new_bf16", "old_fp32"),
             ("compiled_bf16", "old_fp32"), ("fused_bf16", "old_fp32"), ("fused_recompute_bf16", "old_fp32"),
             ("new_bf16", "old_bf16"), ("compiled_bf16", "new_bf16"), ("fused_bf16", "compiled_bf16"),
             ("fused_recompute_bf16", "fused_bf16")]
    for a, b in pairs:
        if a in runs and b in runs:
            (la, ga), (lb, gb) = runs[a], runs[b]
            out[f"{a} vs {b}"] = {"loss_rel_err": _rel(la, lb), "grad_rel_err_max": max(_rel(ga[n], gb[n]) for n in gb),
                                  "grad_rel_err_median": sorted(_rel(ga[n], gb[n]) for n in gb)[len(gb) // 2]}
    del draft
    _release(dev)
    return out


# --- real lengths ------------------------------------------------------------------------------


def real_lengths(n: int, mean: float, longest: int, seed: int = 0) -> list[int]:
    """Return `n` sample lengths like a real chat mix: log-normal (sigma 0.9) with mean `mean`, one at `longest`.

    Median ~0.67x the mean; about 1 sample in 300 is past 7.5x the mean. One sample is set to
    `longest` so every run has the tail the issue names (16K+).
    """
    rng = random.Random(seed)
    sigma = 0.9
    mu = math.log(mean) - sigma**2 / 2
    out = [max(32, min(longest, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]
    out[rng.randrange(n)] = longest
    return out


def _real_store(lengths: list[int], shape: Shape, dtype: torch.dtype) -> MemoryStates:
    """Return samples of `lengths` whose states are slices of one random buffer (distinct ids, masks)."""
    gen = torch.Generator().manual_seed(1)
    longest = max(lengths)
    aux = torch.randn(longest + 64, 3 * shape.hidden, generator=gen).to(dtype)
    final = torch.randn(longest + 64, shape.hidden, generator=gen).to(dtype)
    samples = []
    for i, n in enumerate(lengths):
        mask = torch.ones(n, dtype=torch.bool)
        mask[: max(1, n // 5)] = False  # the prompt: not trained
        off = i % 64
        samples.append(HiddenStateSample(id=f"r{i:05d}", input_ids=torch.randint(0, shape.vocab, (n,), generator=gen),
                                         loss_mask=mask, aux=aux[off : off + n], final=final[off : off + n]))
    return MemoryStates(samples)


def real_bench(path: str, shape: Shape, dev: torch.device, store: MemoryStates, *, max_length: int, micro: int,
               global_batch: int, steps: int, warmup: int, peak: float) -> dict[str, Any]:
    """Return useful tokens/s of `path` on real lengths, batched as the trainer batches them."""
    ids = sorted(store.ids())
    lengths = {s: min(store.length(s), max_length) for s in ids}
    loss_tokens = {s: int(store.samples[s].loss_mask[:max_length].sum()) for s in ids}
    plan = epoch_batches(ids, lengths, global_batch, 16, seed=0, epoch=0)[: warmup + steps]
    steps = len(plan) - warmup
    cfg, draft, head, params, opt = _build(shape, dev, path, max_positions=max_length)
    use_bf16 = dev.type == "cuda"
    dtype = torch.bfloat16 if use_bf16 else torch.float32
    ttt = shape.ttt_steps

    if path == "old":
        objective: torch.nn.Module = TTTObjective(draft)

        def load(i: int) -> list[Any]:
            share = plan[i]
            return [load_batch(store, share[j : j + micro], max_length) for j in range(0, len(share), micro)]
    else:
        objective = PackedTTTObjective(draft)
        copier = DeviceCopier(dev, dtype)

        def load(i: int) -> list[Any]:
            groups = plan_micro_batches(plan[i], lengths, micro * max_length)
            return [pack_samples(store, g, max_length).pin_memory() for g in groups]

    prefetch = Prefetcher(load, len(plan), depth=2)
    counted = {"useful": 0, "loss": 0, "computed": 0, "micro_batches": 0}
    pending = torch.zeros(ttt, N_SUMS, dtype=torch.float64)
    try:
        for i in range(len(plan)):
            if i == warmup:
                _sync(dev)
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                t = time.perf_counter()
                counted = dict.fromkeys(counted, 0)
            loaded = prefetch.get(i)
            opt.zero_grad(set_to_none=True)
            if path == "old":  # the trainer's loop before issue #28
                scale = _scale(sum(step_counts(b.loss_mask, ttt) for b in loaded), ttt, dev)
                for cpu in loaded:
                    b = cpu.to(dev, dtype)
                    sig = target_signals(b, head, draft.draft_ids(), draft.t2d)
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
                        loss, sums = objective(b.input_ids, b.aux, *sig.tensors(), scale, ttt)
                    loss.backward()
                    pending += sums.cpu()
                    counted["computed"] += cpu.input_ids.numel()
            else:  # the trainer's loop now
                scale = _scale(sum(b.step_counts(ttt) for b in loaded), ttt, dev)
                step_sums = torch.zeros(ttt, N_SUMS, dtype=torch.float64, device=dev)
                moving = copier.start(loaded[0])
                for j in range(len(loaded)):
                    b = copier.wait(moving)
                    if j + 1 < len(loaded):
                        moving = copier.start(loaded[j + 1])
                    sig = packed_target_signals(b, head, draft.draft_ids(), draft.t2d)
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
                        loss, sums = packed_call(objective, b, sig, scale, ttt)
                    loss.backward()
                    step_sums += sums
                    counted["computed"] += loaded[j].tokens
                pending += step_sums.cpu()
            float(torch.nn.utils.clip_grad_norm_(params, 0.5))  # the trainer reads the norm every step
            opt.step()
            counted["useful"] += sum(lengths[s] for s in plan[i])
            counted["loss"] += sum(loss_tokens[s] for s in plan[i])
            counted["micro_batches"] += len(loaded)
        _sync(dev)
        elapsed = time.perf_counter() - t
    finally:
        prefetch.close()
    flops_per_token = train_flops_per_token(cfg, ttt, int(sum(lengths.values()) / len(lengths)))
    out = {
        "path": path, "max_length": max_length, "micro_batch_size": micro, "global_batch": global_batch,
        "token_budget": micro * max_length, "steps": steps,
        "useful_tokens_per_s": counted["useful"] / elapsed, "loss_tokens_per_s": counted["loss"] / elapsed,
        "padding_fraction": 1 - counted["useful"] / max(1, counted["computed"]),
        "micro_batches_per_step": counted["micro_batches"] / steps, "step_s": elapsed / steps,
        "fraction_of_peak_at_mean_length": counted["useful"] / elapsed * flops_per_token / 1e12 / peak,
        "max_memory_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None,
        "last_train_loss": float(pending[0, 0] / pending[0, 1].clamp(min=1)),
    }
    del draft, head, params, opt, objective
    _release(dev)
    return out


# --- entry points ------------------------------------------------------------------------------


def _guarded(dev: torch.device, fn: Callable[..., dict[str, Any]], *args: Any, **kw: Any) -> dict[str, Any]:
    """Return fn's result, or {"error": ...} so that one failing part (an OOM, say) leaves the others' figures."""
    try:
        return fn(*args, **kw)
    except Exception as exc:  # noqa: BLE001  (reported in the result, the run goes on)
        _release(dev)
        return {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}



def run_bench(*, shape: Shape = Shape(), path: str = "both", steps: int = 10, warmup: int = 3,
              device: str = "auto", peak_n: int = 8192, peak_iters: int = 50, check: bool = False,
              profile: bool = False, real: bool = False, real_samples: int = 400, real_steps: int = 10,
              real_mean: int = 2100, real_longest: int = 16640, real_max_length: int = 4096,
              long_lengths: tuple[int, ...] = (), long_shape: Shape = KIMI, long_path: str = "fused",
              long_recompute: tuple[bool | int | None, ...] = (False, True), long_steps: int = 3, long_warmup: int = 1,
              out_dir: Path | None = None) -> dict[str, Any]:
    """Return throughput figures of draft training steps on synthetic states (and --all's extras)."""
    dev = _device(device)
    peak = matmul_peak_tflops(dev, peak_n, peak_iters)
    result: dict[str, Any] = {
        "bench": "draft_train", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": "bf16-autocast" if dev.type == "cuda" else "fp32", "hidden": shape.hidden, "vocab": shape.vocab,
        "draft_vocab": shape.draft_vocab, "ttt_steps": shape.ttt_steps, "seq": shape.seq, "batch": shape.batch,
        "steps": steps, "peak_tflops": peak, "torch": torch.__version__,
    }
    if check:
        result["check"] = _guarded(dev, equivalence_check, dev)
    if long_lengths:  # first: the long rows want the card's memory unfragmented
        result["long_shape"] = long_shape._asdict()
        runs = {}
        for n in long_lengths:
            for rc in long_recompute:
                label = "auto" if rc is None else "on" if rc is True else "off" if rc is False else str(rc)
                name = f"{long_path}@{n}/recompute={label}"
                runs[name] = _guarded(dev, long_bench, long_path, long_shape._replace(seq=n, batch=1), dev, rc,
                                      long_steps, long_warmup, peak)
                print(f"long {name}: {json.dumps(runs[name])}", flush=True)
        kernels.enable(False)
        result["long"] = runs
    paths = PATHS if path == "all" else ("old", "new") if path == "both" else tuple(path.split(","))
    if set(paths) - set(PATHS):
        raise ValueError(f"unknown path(s) {sorted(set(paths) - set(PATHS))}: use {PATHS}, both or all")
    result["paths"] = {p: _guarded(dev, shape_bench, p, shape, dev, steps, warmup, peak) for p in paths}
    kernels.enable(False)
    result.update(result["paths"][paths[-1]])  # the newest path's figures at the top level
    if profile:
        result["profile"] = {p: _guarded(dev, profile_step, p, shape, dev, peak, out_dir) for p in paths}
        kernels.enable(False)
    if real:
        lengths = real_lengths(real_samples, real_mean, real_longest)
        store = _real_store(lengths, shape, torch.bfloat16 if dev.type == "cuda" else torch.float32)
        srt = sorted(lengths)
        result["real_lengths"] = {"samples": len(lengths), "mean": sum(lengths) / len(lengths),
                                  "p50": srt[len(srt) // 2], "p90": srt[int(len(srt) * 0.9)],
                                  "p99": srt[int(len(srt) * 0.99)], "max": srt[-1]}
        kw = dict(global_batch=8, steps=real_steps, warmup=2, peak=peak)
        runs = {f"{p}@{real_max_length}": _guarded(dev, real_bench, p, shape, dev, store,
                                                   max_length=real_max_length, micro=2, **kw)
                for p in paths}
        full = max(lengths)
        for p in paths:  # the whole tail, no truncation: one long sample's tokens per micro-batch at most
            if p != "old":
                runs[f"{p}@{full}"] = _guarded(dev, real_bench, p, shape, dev, store, max_length=full, micro=1, **kw)
        kernels.enable(False)
        result["real"] = runs
    return result


def _mem(r: dict[str, Any]) -> str:
    return f"{r['max_memory_gb']:.1f}" if r["max_memory_gb"] is not None else "-"


def table(result: dict[str, Any]) -> str:
    """Return the before/after (and profile, real-length) figures as a short text table."""
    lines = [f"peak {result['peak_tflops']:.0f} TFLOP/s ({result['device']}, torch {result['torch']})",
             f"shape: hidden {result['hidden']}, vocab {result['vocab']}, draft vocab {result['draft_vocab']}, "
             f"TTT {result['ttt_steps']}, {result['batch']} x {result['seq']}",
             "path  tokens/s   step_ms  TFLOP/s  of_peak  max_mem_GB"]
    for p, r in result["paths"].items():
        if "error" in r:
            lines.append(f"{p:<5} error: {r['error']}")
            continue
        lines.append(f"{p:<5} {r['tokens_per_s']:>9.0f} {r['step_s'] * 1e3:>8.1f} {r['achieved_tflops']:>8.1f} "
                     f"{r['fraction_of_peak']:>7.1%}  {_mem(r)}")
    for p, prof in result.get("profile", {}).items():
        if "error" in prof:
            lines.append(f"profile {p} error: {prof['error']}")
            continue
        lines.append(f"profile {p}: wall {prof['wall_ms']:.1f} ms, kernels {prof['kernel_ms']:.1f} ms")
        for name, row in prof["phases"].items():
            lines.append(f"  {name:<28} {row['ms']:>8.2f} ms {row['share']:>6.1%}  "
                         f"of_peak {row['fraction_of_peak']:.1%}")
        kinds = ", ".join(f"{k.split(':')[1]} {v:.1f}" for k, v in prof["backward_kinds_ms"].items())
        lines.append(f"  backward by kind (ms): {kinds}")
    if "real" in result:
        rl = result["real_lengths"]
        lines.append(f"real lengths: {rl['samples']} samples, mean {rl['mean']:.0f}, p50 {rl['p50']}, p90 {rl['p90']}, "
                     f"p99 {rl['p99']}, max {rl['max']}")
        lines.append("run             useful_tok/s  loss_tok/s  padding  micro/step  of_peak  max_mem_GB")
        for name, r in result["real"].items():
            if "error" in r:
                lines.append(f"{name:<15} error: {r['error']}")
                continue
            lines.append(f"{name:<15} {r['useful_tokens_per_s']:>12.0f} {r['loss_tokens_per_s']:>11.0f} "
                         f"{r['padding_fraction']:>7.1%} {r['micro_batches_per_step']:>10.1f} "
                         f"{r['fraction_of_peak_at_mean_length']:>7.1%}  {_mem(r)}")
    if "long" in result:
        ls = result["long_shape"]
        lines.append(f"long context: hidden {ls['hidden']}, heads {ls['heads']}/{ls['kv_heads']}, intermediate "
                     f"{ls['intermediate']}, vocab {ls['vocab']}, draft vocab {ls['draft_vocab']}, TTT {ls['ttt_steps']}")
        lines.append("run                              useful_tok/s  step_s  TFLOP/s  of_peak  max_mem_GB  reserved_GB")
        for name, r in result["long"].items():
            if "error" in r:
                lines.append(f"{name:<32} error: {r['error'][:160]}")
                continue
            lines.append(f"{name:<32} {r['useful_tokens_per_s']:>12.0f} {r['step_s']:>7.2f} {r['achieved_tflops']:>8.1f} "
                         f"{r['fraction_of_peak']:>7.1%}  {_mem(r):>10}  {r['max_reserved_gb'] or 0:>10.1f}")
    if "check" in result:
        c = result["check"]
        if "error" in c:
            lines.append(f"check error: {c['error']}")
        for k, v in c.items():
            if isinstance(v, dict):
                lines.append(f"check {k}: loss rel {v['loss_rel_err']:.2e}, grad rel max {v['grad_rel_err_max']:.2e}"
                             f" median {v['grad_rel_err_median']:.2e} (over parameters)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = Shape()
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--intermediate", type=int, default=d.intermediate)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--draft-vocab", type=int, default=d.draft_vocab)
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps)
    p.add_argument("--seq", type=int, default=d.seq)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--peak-n", type=int, default=8192)
    p.add_argument("--peak-iters", type=int, default=50)
    p.add_argument("--path", default="both",
                   help="old, new, compiled, fused, a comma list of them, both (old and new) or all (all four)")
    p.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (tests)")
    p.add_argument("--check", action="store_true", help="old vs new path loss/gradients on the device")
    p.add_argument("--profile", action="store_true", help="torch.profiler of one step per path, by phase")
    p.add_argument("--real", action="store_true", help="real-length benchmark (useful tokens/s)")
    p.add_argument("--all", action="store_true", help="--check --profile --real")
    p.add_argument("--real-samples", type=int, default=400)
    p.add_argument("--real-steps", type=int, default=10)
    p.add_argument("--real-max-length", type=int, default=4096,
                   help="max_length of the old-vs-new real-length comparison (the old path's attention is T^2)")
    p.add_argument("--long", default="", help="long-context lengths, e.g. 16384,32768,65536: one row of L per step")
    p.add_argument("--long-shape", choices=("kimi", "bench"), default="kimi",
                   help="kimi: hidden 7168, vocab 163840, draft vocab 32000, TTT 7; bench: this run's --hidden etc.")
    p.add_argument("--long-path", choices=PATHS[1:], default="fused")
    p.add_argument("--long-recompute", default="off,on",
                   help="comma list of off, on, auto or a number of steps (PackedTTTObjective's recompute)")
    p.add_argument("--long-steps", type=int, default=3)
    p.add_argument("--long-warmup", type=int, default=1)
    p.add_argument("--out-dir", default=None, help="write result.json, table.txt and the profiler tables here")
    a = p.parse_args(argv)
    shape = Shape(a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab, a.draft_vocab, a.ttt_steps, a.seq, a.batch)
    extra: dict[str, Any] = {}
    if a.tiny:
        shape = TINY._replace(ttt_steps=a.ttt_steps if a.ttt_steps != d.ttt_steps else TINY.ttt_steps)
        extra = dict(device="cpu", peak_n=64, peak_iters=2, real_samples=40, real_mean=60, real_longest=400)
        a.real_max_length = min(a.real_max_length, 128)
    out_dir = Path(a.out_dir) if a.out_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    kw: dict[str, Any] = dict(shape=shape, path=a.path, steps=a.steps, warmup=a.warmup, device=a.device,
                              peak_n=a.peak_n, peak_iters=a.peak_iters, check=a.check or a.all,
                              profile=a.profile or a.all, real=a.real or a.all, real_samples=a.real_samples,
                              real_steps=a.real_steps, real_max_length=a.real_max_length, out_dir=out_dir)
    modes = {"off": False, "on": True, "auto": None}
    if a.long:
        long_shape = KIMI if a.long_shape == "kimi" else shape
        lengths = tuple(int(x) for x in a.long.split(","))
        if a.tiny:
            long_shape, lengths = TINY, tuple(min(n, 256) for n in lengths)
        kw.update(long_lengths=lengths, long_shape=long_shape, long_path=a.long_path,
                  long_recompute=tuple(modes[m] if m in modes else int(m) for m in a.long_recompute.split(",")),
                  long_steps=a.long_steps,
                  long_warmup=a.long_warmup)
    kw.update(extra)
    result = run_bench(**kw)
    if out_dir is not None:
        (out_dir / "result.json").write_text(json.dumps(result, indent=1))
        (out_dir / "table.txt").write_text(table(result) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
