"""Training the EAGLE-3 draft with training-time test (TTT) on stored target hidden states.

One optimizer step:
  1. the global batch (length-bucketed ids) is split over ranks, each rank's share into micro-batches;
  2. per micro-batch, the target's logits come from the stored final hidden state and the target's
     lm_head: their argmax says which positions the draft can match at all (in the draft vocab),
     and their softmax restricted to the draft vocab is what the draft learns;
  3. TTT: step 0 feeds the target's fused aux states; step k feeds the draft's own hidden output of
     step k-1 and the input ids shifted by k, at positions t+k (see draft.TTTCache for attention);
  4. loss = sum_k 0.8^k * soft-CE(target_p, draft) over loss-masked positions whose target argmax
     lies in the draft vocab, divided by the count of loss-masked positions of step k over the
     whole global batch (known from the masks alone, so every rank divides by the same number and
     N ranks add up to exactly the 1-rank gradient).

Metrics per TTT step k, over loss-masked positions (a target token outside the draft vocab counts
as a miss): acc_k (unconditional top-1 agreement), cond_acc_k (agreement given steps < k all
agreed at the same origin), and the expected acceptance length 1 + sum_k prod_{j<=k} cond_acc_j.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from training.atomic import write_text as _atomic_write_text
from training.distributed import DistInfo, all_reduce_sum, barrier, init_distributed, shutdown
from training.draft import DraftConfig, Eagle3Draft, TTTCache
from training.errors import ModelMismatchError, StoreError, TrainingError
from training.online import OnlineStates
from training.store import HiddenStateStore, StoreMeta, dequantize_fp8

States = HiddenStateStore | OnlineStates  # stored states, or the target run beside the draft
from training.target_head import TargetHead, load_embeddings, read_target_config
from training.train_config import TrainConfig
from training.vocab import DraftVocab, count_tokens, build_vocab

CHECKPOINT_FORMAT = "curator-eagle3-checkpoint/1"
# per TTT step: loss_sum, n_valid, n_correct, n_prefix (all right through k), n_prev (all right through k-1)
N_SUMS = 5

MetricsCallback = Callable[[dict[str, Any]], None]


# -- data -------------------------------------------------------------------------------------


@dataclass
class Batch:
    ids: list[str]
    input_ids: torch.Tensor  # [B, T] int64, right-padded with 0
    loss_mask: torch.Tensor  # [B, T] bool, False on padding
    aux: torch.Tensor  # [B, T, 3*Ht]: bf16/float32, or fp8 values with aux_scale
    final: torch.Tensor  # [B, T, H]: likewise, with final_scale
    aux_scale: torch.Tensor | None = None  # [B, T, 3] float32 when aux is fp8 as stored
    final_scale: torch.Tensor | None = None  # [B, T, 1]

    def to(self, device: torch.device, dtype: torch.dtype) -> Batch:
        """Return the batch on `device` in `dtype`; fp8 states cross as fp8 and are dequantised there."""

        def states(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
            if scale is None:
                return x.to(device=device, dtype=dtype)
            return dequantize_fp8(x.to(device), scale.to(device), dtype)

        return Batch(
            self.ids,
            self.input_ids.to(device),
            self.loss_mask.to(device),
            states(self.aux, self.aux_scale),
            states(self.final, self.final_scale),
        )


def load_batch(store: States, ids: Sequence[str], max_length: int) -> Batch:
    """Return the samples `ids` cut to `max_length`, right-padded to the longest into one batch.

    Samples read as stored fp8 (a store opened with dequantize=False) stay fp8, with their
    scales, until `Batch.to` dequantises them on the training device.
    """
    samples = store.load_many(list(ids))
    if any(s.final is None for s in samples):
        raise StoreError(f"{store.root} keeps no final hidden states; capture with them to train offline")
    T = min(max_length, max(len(s) for s in samples))
    first = samples[0]
    B, aux_w, h = len(samples), first.aux.shape[-1], first.final.shape[-1]  # type: ignore[union-attr]
    quantized = first.aux_scale is not None and first.final_scale is not None
    input_ids = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    # Online states are already on the GPU: build the batch where they are.
    aux = torch.zeros(B, T, aux_w, dtype=first.aux.dtype, device=first.aux.device)
    final = torch.zeros(B, T, h, dtype=first.final.dtype, device=first.aux.device)  # type: ignore[union-attr]
    aux_scale = torch.zeros(B, T, first.aux_scale.shape[-1]) if quantized else None  # type: ignore[union-attr]
    final_scale = torch.zeros(B, T, 1) if quantized else None
    for i, s in enumerate(samples):
        n = min(T, len(s))
        input_ids[i, :n] = s.input_ids[:n]
        loss_mask[i, :n] = s.loss_mask[:n]
        aux[i, :n] = s.aux[:n]
        final[i, :n] = s.final[:n]  # type: ignore[index]
        if aux_scale is not None and final_scale is not None:
            aux_scale[i, :n] = s.aux_scale[:n]  # type: ignore[index]
            final_scale[i, :n] = s.final_scale[:n]  # type: ignore[index]
    return Batch(list(ids), input_ids, loss_mask, aux, final, aux_scale, final_scale)


class Prefetcher:
    """Loads the micro-batches of the next steps on a thread while the current step runs.

    The step order is fixed in advance (`epoch_batches`), so what is read ahead is exactly what
    the loop asks for next; a resumed run starts its read-ahead from its checkpoint's step.
    Reading and padding a step's samples is CPU and disk work that mostly releases the GIL. For
    the reference benchmark's small drafts, a step went from 120 ms to 73 ms with it.
    """

    def __init__(self, load: Callable[[int], list[Batch]], total_steps: int, depth: int = 2) -> None:
        self._load = load
        self._total = total_steps
        self._depth = depth
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch") if depth > 0 else None
        self._ahead: dict[int, Future[list[Batch]]] = {}

    def get(self, step: int) -> list[Batch]:
        """Return step `step`'s loaded micro-batches, and start reading the steps after it."""
        future = self._ahead.pop(step, None)
        loaded = future.result() if future is not None else self._load(step)
        if self._pool is not None:
            for ahead in range(step + 1, min(step + 1 + self._depth, self._total)):
                if ahead not in self._ahead:
                    self._ahead[ahead] = self._pool.submit(self._load, ahead)
        return loaded

    def close(self) -> None:
        if self._pool is not None:
            for future in self._ahead.values():
                future.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None


def split_eval(ids: Sequence[str], fraction: float, max_eval: int | None = None) -> tuple[list[str], list[str]]:
    """Return (train ids, eval ids): eval holds the ids whose hash falls under `fraction`.

    Hashing the id (not its position) keeps a sample on the same side as the store grows.
    """
    train, held = [], []
    for sid in ids:
        h = int.from_bytes(hashlib.sha1(sid.encode("utf-8")).digest()[:8], "big") / 2**64
        (held if h < fraction else train).append(sid)
    return train, held[:max_eval] if max_eval is not None else held


def epoch_batches(
    ids: Sequence[str], lengths: dict[str, int], global_batch: int, bucket_batches: int, seed: int, epoch: int
) -> list[list[str]]:
    """Return this epoch's global batches: shuffled, length-sorted within windows, order shuffled.

    Depends only on (ids, seed, epoch), so a resumed run rebuilds the same order. The last
    partial batch is dropped so that every step has the same global batch on any rank count.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(ids)
    rng.shuffle(order)
    window = global_batch * max(1, bucket_batches)
    batches: list[list[str]] = []
    for w in range(0, len(order), window):
        chunk = sorted(order[w : w + window], key=lambda s: lengths[s])
        batches.extend(chunk[i : i + global_batch] for i in range(0, len(chunk) - global_batch + 1, global_batch))
    rng.shuffle(batches)
    return batches


# -- the objective ----------------------------------------------------------------------------


@dataclass
class TargetSignals:
    argmax: torch.Tensor  # [B, T] the target's greedy token at each position
    probs: torch.Tensor  # [B, T, draft_vocab] float32, softmax over the draft vocab's logits
    valid: torch.Tensor  # [B, T] bool: the token after this position is loss-masked
    in_vocab: torch.Tensor  # [B, T] bool: the target's argmax has a draft id

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (argmax, probs, valid, in_vocab), the order TTTObjective takes them in."""
        return self.argmax, self.probs, self.valid, self.in_vocab


def valid_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Return [B, T] bool: the target's prediction at p counts when token p+1 is in the loss mask."""
    valid = torch.zeros_like(loss_mask)
    valid[:, :-1] = loss_mask[:, 1:]
    return valid


@torch.no_grad()
def target_signals(batch: Batch, head: TargetHead, draft_ids: torch.Tensor, t2d: torch.Tensor) -> TargetSignals:
    """Return the target's argmax, its draft-vocab distribution and the masks for `batch`."""
    argmax, probs = [], []
    for row in batch.final:  # one sequence at a time bounds the [T, V] logits
        logits = head(row)  # (T, V)
        argmax.append(logits.argmax(-1))
        probs.append(logits[:, draft_ids].float().softmax(-1))  # (T, draft_vocab)
    am = torch.stack(argmax)
    return TargetSignals(am, torch.stack(probs), valid_positions(batch.loss_mask), t2d[am])


class TTTObjective(nn.Module):
    """The whole TTT unroll as one module call, so DDP sees one forward per backward."""

    def __init__(self, draft: Eagle3Draft) -> None:
        super().__init__()
        self.draft = draft

    def forward(
        self,
        input_ids: torch.Tensor,
        aux: torch.Tensor,
        target_argmax: torch.Tensor,
        target_probs: torch.Tensor,
        valid_mask: torch.Tensor,
        in_vocab: torch.Tensor,
        step_scale: torch.Tensor,
        ttt_steps: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (loss = sum_k step_scale[k] * loss_sum_k, metric sums [ttt_steps, N_SUMS]).

        Takes the TargetSignals fields as plain tensors so DDP can handle the inputs.
        """
        draft = self.draft
        B, T = input_ids.shape
        sums = torch.zeros(ttt_steps, N_SUMS, dtype=torch.float64, device=input_ids.device)
        loss = aux.new_zeros((), dtype=torch.float32)
        cache, hidden = TTTCache(), aux
        positions = torch.arange(T, device=input_ids.device).expand(B, T)
        prefix = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)  # all right so far, per origin
        for k in range(ttt_steps):
            n = T - 1 - k  # origins t whose step-k target position t+1+k exists
            if n <= 0:
                break
            step_ids = F.pad(input_ids[:, k + 1 :], (0, k + 1))  # token x_{t+1+k} at origin t
            out = draft(step_ids, hidden, position_ids=positions + k, cache=cache)
            hidden = out.hidden  # (B, T, H): the next step's input
            logits = out.logits[:, :n].float()  # (B, n, draft_vocab)
            valid = valid_mask[:, 1 + k :]  # (B, n)
            train_mask = valid & in_vocab[:, 1 + k :]
            soft_ce = -(target_probs[:, 1 + k :] * F.log_softmax(logits, dim=-1)).sum(-1)  # (B, n)
            loss_sum = (soft_ce * train_mask).sum()
            loss = loss + step_scale[k] * loss_sum
            with torch.no_grad():
                correct = (draft.draft_to_target(logits.argmax(-1)) == target_argmax[:, 1 + k :]) & valid
                prev = prefix[:, :n]
                prefix = prev & correct
                counted = [valid.sum(), correct.sum(), prefix.sum(), (prev & valid).sum()]
                sums[k] = torch.stack([loss_sum.detach().double(), *(c.double() for c in counted)])
        return loss, sums


def step_counts(loss_mask: torch.Tensor, ttt_steps: int) -> torch.Tensor:
    """Return float64 [ttt_steps]: the loss-masked positions of each TTT step in a micro-batch."""
    valid = valid_positions(loss_mask)
    return torch.stack([valid[:, 1 + k :].sum() for k in range(ttt_steps)]).double()


def summarize(sums: torch.Tensor, step_weight: float = 0.8) -> dict[str, Any]:
    """Return loss, loss_k, acc, cond_acc and accept_length from metric sums [ttt_steps, N_SUMS]."""
    s = sums.double().cpu()
    n_valid = s[:, 1].clamp(min=1)
    loss_k = (s[:, 0] / n_valid).tolist()
    acc = (s[:, 2] / n_valid).tolist()
    cond = (s[:, 3] / s[:, 4].clamp(min=1)).tolist()
    accept, run = 1.0, 1.0
    for c in cond:
        run *= c
        accept += run
    return {
        "loss": sum(step_weight**k * lk for k, lk in enumerate(loss_k)),
        "loss_k": loss_k,
        "acc": acc,
        "cond_acc": cond,
        "accept_length": accept,
        "positions": int(s[0, 1]),
    }


@torch.no_grad()
def metric_sums(
    draft: Eagle3Draft,
    store: States,
    ids: Sequence[str],
    ttt_steps: int,
    head: TargetHead,
    *,
    batch_size: int = 4,
    max_length: int = 2048,
    autocast: bool = False,
) -> torch.Tensor:
    """Return the metric sums [ttt_steps, N_SUMS] of `draft` over the samples `ids` (this rank only)."""
    device = next(draft.parameters()).device
    dtype = torch.bfloat16 if autocast else torch.float32
    objective = TTTObjective(draft)
    total = torch.zeros(ttt_steps, N_SUMS, dtype=torch.float64, device=device)
    scale = torch.zeros(ttt_steps, device=device)
    was_training = draft.training
    draft.eval()
    ordered = sorted(ids, key=store.length)  # similar lengths together: less padding
    for i in range(0, len(ordered), batch_size):
        batch = load_batch(store, ordered[i : i + batch_size], max_length).to(device, dtype)
        sig = target_signals(batch, head, draft.draft_ids(), draft.t2d)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            _, sums = objective(batch.input_ids, batch.aux, *sig.tensors(), scale, ttt_steps)
        total += sums
    draft.train(was_training)
    return total


def offline_metrics(
    draft: Eagle3Draft,
    store: States,
    ids: Sequence[str],
    ttt_steps: int,
    target_head: TargetHead,
    *,
    batch_size: int = 4,
    max_length: int = 2048,
    step_weight: float = 0.8,
) -> dict[str, Any]:
    """Return acc (per TTT step), cond_acc, accept_length, loss and positions of `draft` on `ids`.

    Teacher-forced on stored states, as in training: step k drafts the token k+1 ahead from the
    draft's own earlier hidden states. Summed over ranks when run under torchrun.
    """
    autocast = next(draft.parameters()).device.type == "cuda"
    sums = metric_sums(draft, store, ids, ttt_steps, target_head, batch_size=batch_size, max_length=max_length,
                       autocast=autocast)
    return summarize(all_reduce_sum(sums), step_weight)


# -- checkpoints ------------------------------------------------------------------------------


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the newest complete checkpoint directory of a run, if any."""
    pointer = Path(run_dir) / "checkpoints" / "latest.json"
    if not pointer.exists():
        return None
    try:
        name = json.loads(pointer.read_text(encoding="utf-8"))["name"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainingError(f"{pointer} is unreadable ({exc}); point --checkpoint at a checkpoints/step-* folder") from exc
    path = Path(run_dir) / "checkpoints" / str(name)
    return path if (path / "meta.json").exists() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """Return the checkpoint directory for a run directory (its latest) or a checkpoint directory."""
    p = Path(path)
    if (p / "meta.json").exists() and (p / "draft.safetensors").exists():
        return p
    ckpt = latest_checkpoint(p)
    if ckpt is None:
        raise TrainingError(f"{p} is neither a checkpoint nor a run directory with one; train first")
    return ckpt


def save_checkpoint(
    run_dir: Path, draft: Eagle3Draft, meta: dict[str, Any], trainer_state: dict[str, Any] | None
) -> Path:
    """Write checkpoints/step-NNNNNNN/ (weights, meta, optimizer state) atomically; return it."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{int(meta['step']):07d}"
    tmp = root / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
    tmp.mkdir()
    state = {k: v.detach().cpu().contiguous() for k, v in draft.trainable_state_dict().items()}
    save_file(state, str(tmp / "draft.safetensors"), metadata={"format": CHECKPOINT_FORMAT})
    if trainer_state is not None:
        torch.save(trainer_state, tmp / "trainer_state.pt")
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write_text(root / "latest.json", json.dumps({"name": name, "step": int(meta["step"])}))
    return final


def load_checkpoint_draft(ckpt: str | Path, target_dir: str | Path | None = None) -> tuple[Eagle3Draft, dict[str, Any]]:
    """Return (draft with the checkpoint's weights, its meta); embeddings from the target when reachable."""
    ckpt = resolve_checkpoint(ckpt)
    meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
    draft = Eagle3Draft(DraftConfig.from_dict(meta["draft_config"]))
    missing, unexpected = draft.load_state_dict(load_file(str(ckpt / "draft.safetensors")), strict=False)
    if unexpected or set(missing) - {"embed_tokens.weight"}:
        raise ModelMismatchError(f"checkpoint {ckpt} does not fit its config (missing {missing}, unexpected {unexpected})")
    target = target_dir or meta.get("target_dir")
    if target and Path(target).exists():
        draft.load_embeddings(load_embeddings(target))
    return draft, meta


# -- the loop ---------------------------------------------------------------------------------


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    step: int
    train: dict[str, Any] = field(default_factory=dict)  # last logged train metrics
    eval: dict[str, Any] = field(default_factory=dict)  # last eval metrics
    vocab: dict[str, Any] = field(default_factory=dict)


def lr_lambda(total_steps: int, warmup_ratio: float, min_lr_ratio: float) -> Callable[[int], float]:
    """Return the LR multiplier: linear warmup, then cosine decay to `min_lr_ratio`."""
    warmup = max(1, math.ceil(total_steps * warmup_ratio))

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _check_inputs(meta: StoreMeta, target_cfg: dict[str, Any], head: TargetHead, store: States) -> None:
    if not meta.has_final:
        raise StoreError(f"{store.root} keeps no final hidden states; capture with them to train offline")
    if int(target_cfg["hidden_size"]) != meta.hidden_size or head.hidden_size != meta.hidden_size:
        raise ModelMismatchError(
            f"store hidden size {meta.hidden_size} != target hidden size {target_cfg['hidden_size']}: "
            "the store was captured from another model"
        )
    if head.vocab_size != meta.vocab_size:
        raise ModelMismatchError(f"store vocab {meta.vocab_size} != target lm_head rows {head.vocab_size}")
    if len(store) == 0:
        raise StoreError(f"{store.root} holds no samples")


RESUME_INSENSITIVE = ("device", "log_every", "eval_every", "save_every", "out")


def _check_same_capture(train: StoreMeta, held: StoreMeta, path: str) -> None:
    """Refuse a held-out store captured differently from the training store."""
    fields = ("hidden_size", "aux_layer_ids", "layer_convention", "vocab_size", "has_final")
    differ = [f for f in fields if getattr(train, f) != getattr(held, f)]
    if differ:
        raise TrainingError(f"eval_data {path} was captured differently from the training store: {', '.join(differ)}")


def _prepare_run_dir(cfg: TrainConfig, resume: bool, dist_info: DistInfo) -> tuple[Path, Path | None]:
    run_dir = Path(cfg.out)
    ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
    if ckpt is not None and not resume:
        raise TrainingError(f"{run_dir} already has checkpoints; pass --resume to continue it or choose another --out")
    if resume and ckpt is not None:
        saved = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))["train_config"]
        diffs = [
            f"{k}: {saved.get(k)!r} -> {v!r}"
            for k, v in cfg.to_dict().items()
            if k not in RESUME_INSENSITIVE and saved.get(k) != v
        ]
        if diffs:
            raise TrainingError(f"--resume with a different config changes the run: {'; '.join(diffs)}")
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier()
    return run_dir, ckpt


def _resolve_vocab(
    cfg: TrainConfig, store: States, train_ids: list[str], run_dir: Path, dist_info: DistInfo, fresh: bool
) -> DraftVocab:
    path = run_dir / "vocab.json"
    # Only a resumed run reuses its vocab; a fresh one (also in the folder of a run killed before
    # its first checkpoint) counts it again, so the file always describes these weights.
    if (fresh or not path.exists()) and dist_info.is_main:
        ids = train_ids[: cfg.vocab_max_samples] if cfg.vocab_max_samples else train_ids
        counts, n, skipped = count_tokens((store.tokens(sid) for sid in ids), store.meta.vocab_size)
        vocab = build_vocab(counts, cfg.draft_vocab_size, samples_counted=n, samples_skipped=skipped)
        vocab.save(path)
    barrier()
    return DraftVocab.load(path)


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines logged after `step` (a resumed run logs them again)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                keep.append(line)
        except (ValueError, AttributeError):
            continue  # a line cut by the kill: dropped
    _atomic_write_text(path, "".join(line + "\n" for line in keep))


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    on_metrics: MetricsCallback | None = None,
    stop_after_steps: int | None = None,
) -> TrainResult:
    """Train a draft as `cfg` says; return where its final checkpoint is and the last metrics.

    `resume` continues the run in `cfg.out` from its latest checkpoint exactly (weights,
    optimizer, scheduler, RNG, data position, pending metric sums). `stop_after_steps` ends this
    session after that many optimizer steps with a checkpoint, for time-sliced jobs.
    """
    dist_info = init_distributed(cfg.device)
    device, world, rank = dist_info.device, dist_info.world_size, dist_info.rank
    if cfg.global_batch_size % world:
        raise TrainingError(f"global_batch_size {cfg.global_batch_size} must be a multiple of the {world} ranks")
    use_bf16 = cfg.bf16 if cfg.bf16 is not None else device.type == "cuda"
    data_dtype = torch.bfloat16 if use_bf16 else torch.float32

    # fp8 stores are read as stored and dequantised on the training device (Batch.to)
    store = (OnlineStates.open(cfg.target, cfg.data, device=device) if cfg.online
             else HiddenStateStore.open(cfg.data, dequantize=False))
    target_cfg = read_target_config(cfg.target)
    head = TargetHead.from_pretrained(cfg.target, dtype=data_dtype, device=device)
    _check_inputs(store.meta, target_cfg, head, store)
    run_dir, ckpt = _prepare_run_dir(cfg, resume, dist_info)
    eval_store = store
    if cfg.eval_data:
        # Held-out prompts captured into their own store: every sample of --data trains.
        eval_store = HiddenStateStore.open(cfg.eval_data, dequantize=False)
        _check_same_capture(store.meta, eval_store.meta, cfg.eval_data)
        train_ids = sorted(store.ids())
        eval_ids = sorted(eval_store.ids())[: cfg.eval_max_samples]
    else:
        train_ids, eval_ids = split_eval(store.ids(), cfg.eval_fraction, cfg.eval_max_samples)
    if cfg.max_train_samples is not None:
        train_ids = train_ids[: cfg.max_train_samples]
    if len(train_ids) < cfg.global_batch_size:
        raise TrainingError(
            f"{len(train_ids)} training samples are fewer than global_batch_size {cfg.global_batch_size}"
        )
    if ckpt is None and dist_info.is_main:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # left by a run killed before its first checkpoint
    vocab = _resolve_vocab(cfg, store, train_ids, run_dir, dist_info, fresh=ckpt is None)

    from training.export import sglang_layer_ids  # export imports this module: import at call time

    torch.manual_seed(cfg.seed)
    draft_cfg = DraftConfig.from_target_config(
        {**target_cfg, "vocab_size": head.vocab_size},
        draft_vocab_size=vocab.size,
        aux_layer_ids=sglang_layer_ids(store.meta.aux_layer_ids, store.meta.layer_convention),
        intermediate_size=cfg.intermediate_size,
    )
    draft = Eagle3Draft(draft_cfg)
    draft.load_embeddings(load_embeddings(cfg.target))
    draft.set_vocab(vocab.d2t, vocab.t2d)
    if cfg.init_lm_head_from_target:
        draft.init_lm_head_from_target(head.weight)
    draft.to(device)

    lengths = {sid: min(store.length(sid), cfg.max_length) for sid in train_ids}
    batches_per_epoch = len(train_ids) // cfg.global_batch_size
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * batches_per_epoch))
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, cfg.warmup_ratio, cfg.min_lr_ratio))

    step = 0
    pending = torch.zeros(cfg.ttt_steps, N_SUMS, dtype=torch.float64)
    pending_tokens = 0
    if ckpt is not None:
        state_dict = load_file(str(ckpt / "draft.safetensors"))
        draft.load_state_dict(state_dict, strict=False)
        trainer_state = torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)
        optimizer.load_state_dict(trainer_state["optimizer"])
        scheduler.load_state_dict(trainer_state["scheduler"])
        _set_rng_state(trainer_state["rng"])
        step = int(trainer_state["step"])
        pending = trainer_state["pending_sums"].double()
        pending_tokens = int(trainer_state["pending_tokens"])
        if dist_info.is_main:
            _truncate_metrics(run_dir / "metrics.jsonl", step)

    objective: nn.Module = TTTObjective(draft)
    if dist_info.enabled:
        objective = nn.parallel.DistributedDataParallel(
            objective, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
        )
    weights = torch.tensor([cfg.step_weight**k for k in range(cfg.ttt_steps)], dtype=torch.float64)
    vocab_info = {k: v for k, v in vocab.to_json().items() if k != "draft_ids"}
    ckpt_meta = {
        "format": CHECKPOINT_FORMAT,
        "draft_config": draft_cfg.to_dict(),
        "target_dir": str(Path(cfg.target).resolve()),
        "target_config": {k: target_cfg.get(k) for k in ("architectures", "model_type", "hidden_size",
                                                           "num_hidden_layers", "vocab_size", "_name_or_path")},
        "store": {**store.meta.to_json(), "path": str(Path(cfg.data).resolve()), "samples": len(store)},
        "aux_layer_ids": store.meta.aux_layer_ids,
        "layer_convention": store.meta.layer_convention,
        "vocab": vocab_info,
        "ttt_steps": cfg.ttt_steps,
        "train_config": cfg.to_dict(),
    }

    def save(at_step: int) -> Path:
        path = run_dir / "checkpoints" / f"step-{at_step:07d}"
        if dist_info.is_main:
            path = save_checkpoint(run_dir, draft, {**ckpt_meta, "step": at_step}, {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": _rng_state(),
                "step": at_step,
                "epoch": at_step // batches_per_epoch,
                "batch_in_epoch": at_step % batches_per_epoch,
                "pending_sums": pending.clone(),
                "pending_tokens": pending_tokens,
            })
        barrier()
        return path

    def emit(record: dict[str, Any]) -> None:
        if dist_info.is_main:
            _append_jsonl(run_dir / "metrics.jsonl", record)
            if on_metrics is not None:
                on_metrics(record)

    def run_eval(at_step: int) -> dict[str, Any]:
        if not eval_ids:
            return {}
        sums = metric_sums(draft, eval_store, eval_ids[rank::world], cfg.ttt_steps, head,
                           batch_size=cfg.micro_batch_size, max_length=cfg.max_length, autocast=use_bf16)
        record = {"split": "eval", "step": at_step, **summarize(all_reduce_sum(sums), cfg.step_weight),
                  "samples": len(eval_ids)}
        emit(record)
        return record

    last_train: dict[str, Any] = {}
    last_eval: dict[str, Any] = {}
    last_saved = step if ckpt is not None else -1
    session_steps = 0
    epoch_cache: tuple[int, list[list[str]]] = (-1, [])
    t_log = time.perf_counter()
    grad_norms: list[float] = []
    draft.train()
    epoch_lock = threading.Lock()

    def load_step(at_step: int) -> list[Batch]:
        nonlocal epoch_cache
        epoch, index = divmod(at_step, batches_per_epoch)
        with epoch_lock:
            if epoch_cache[0] != epoch:
                epoch_cache = (epoch, epoch_batches(train_ids, lengths, cfg.global_batch_size, cfg.bucket_batches,
                                                    cfg.seed, epoch))
            local = epoch_cache[1][index][rank::world]
        micro = [local[i : i + cfg.micro_batch_size] for i in range(0, len(local), cfg.micro_batch_size)]
        return [load_batch(store, ids, cfg.max_length) for ids in micro]

    # Online states run the target on the GPU: read those in the loop, not on a second thread.
    prefetch = Prefetcher(load_step, total_steps, depth=0 if cfg.online else 2)
    try:
        while step < total_steps:
            loaded = prefetch.get(step)
            # every rank divides by the same global count of loss positions per TTT step
            counts = all_reduce_sum(sum(step_counts(b.loss_mask, cfg.ttt_steps) for b in loaded).to(device))
            step_scale = (weights.to(device) / counts.clamp(min=1) * world).float()
            optimizer.zero_grad(set_to_none=True)
            for i, cpu_batch in enumerate(loaded):
                batch = cpu_batch.to(device, data_dtype)
                sig = target_signals(batch, head, draft.draft_ids(), draft.t2d)
                sync = i == len(loaded) - 1 or not dist_info.enabled
                ctx = nullcontext() if sync else objective.no_sync()  # type: ignore[operator]
                with ctx:
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                        loss, sums = objective(batch.input_ids, batch.aux, *sig.tensors(), step_scale, cfg.ttt_steps)
                    loss.backward()
                pending += sums.cpu()
                pending_tokens += int(cpu_batch.loss_mask.shape[0] * cpu_batch.loss_mask.shape[1])
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)))
            optimizer.step()
            scheduler.step()
            step += 1
            session_steps += 1
            if step % cfg.log_every == 0 or step == total_steps:
                totals = all_reduce_sum(pending.to(device)).cpu()
                tokens = int(all_reduce_sum(torch.tensor([pending_tokens], device=device)).item())
                elapsed = time.perf_counter() - t_log
                last_train = {
                    "split": "train", "step": step, "epoch": round(step / batches_per_epoch, 4),
                    "lr": scheduler.get_last_lr()[0], **summarize(totals, cfg.step_weight),
                    "grad_norm": sum(grad_norms) / len(grad_norms), "tokens": tokens,
                    "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0, "total_steps": total_steps,
                }
                emit(last_train)
                pending.zero_()
                pending_tokens, grad_norms, t_log = 0, [], time.perf_counter()
            if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                last_eval = run_eval(step)
            if cfg.save_every and step % cfg.save_every == 0 and step < total_steps:
                save(step)
                last_saved = step
            if stop_after_steps is not None and session_steps >= stop_after_steps and step < total_steps:
                break
    finally:
        prefetch.close()
    if step == total_steps:
        last_eval = run_eval(step) or last_eval
    path = save(step) if last_saved != step else run_dir / "checkpoints" / f"step-{step:07d}"
    if dist_info.is_main and step == total_steps:
        _atomic_write_text(run_dir / "summary.json", json.dumps(
            {"step": step, "train": last_train, "eval": last_eval, "vocab": vocab_info,
             "checkpoint": str(path)}, indent=2))
    return TrainResult(run_dir, path, step, last_train, last_eval, vocab_info)


def _local_rank_main(rank: int, world: int, port: int, cfg_dict: dict[str, Any], threads: int | None) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if threads:
        torch.set_num_threads(threads)
    try:
        train(TrainConfig.from_dict(cfg_dict))
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()


def train_local_ranks(cfg: TrainConfig, world_size: int, *, threads_per_rank: int | None = None) -> None:
    """Train `cfg` on `world_size` processes of this machine, as torchrun would start them.

    For notebooks and tests; on a cluster use `torchrun --nproc-per-node N -m training.trainer`.
    """
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_local_rank_main, args=(world_size, port, cfg.to_dict(), threads_per_rank), nprocs=world_size, join=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Train from a JSON config without the curator CLI: `torchrun --nproc-per-node 8 -m training.trainer -c run.json`."""
    import argparse

    from training.train_config import load_config

    parser = argparse.ArgumentParser(prog="python -m training.trainer", description=main.__doc__)
    parser.add_argument("-c", "--config", required=True, help="JSON (or YAML, with PyYAML) training config")
    parser.add_argument("--resume", action="store_true", help="continue the run in `out` from its latest checkpoint")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override one option")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    cfg = load_config(args.config, **overrides)
    is_main = int(os.environ.get("RANK", "0")) == 0

    def log(record: dict[str, Any]) -> None:
        print(json.dumps({k: record[k] for k in ("split", "step", "loss", "acc", "accept_length") if k in record}),
              flush=True)

    try:
        result = train(cfg, resume=args.resume, on_metrics=log if is_main else None)
    except TrainingError as exc:
        shutdown(clean=False)
        print(f"error: {exc}", flush=True)
        return 1
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()
    if is_main:
        print(json.dumps({"checkpoint": str(result.checkpoint), "step": result.step, "eval": result.eval}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
