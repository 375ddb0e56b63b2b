"""Training a draft (EAGLE-3 by default) with training-time test (TTT) on stored target hidden states.

A recipe in two parts: `setup` opens the data and the target's head, splits train and held-out
ids, builds the draft, its vocabulary and optimizer, and restores a checkpoint when resuming;
`train` runs the loop. The pieces live beside it: `batches` (reading and ordering samples),
`checkpoint` (the checkpoint format and I/O), `layers` (which target layers feed the draft). What the
draft is, its objective and its metrics are its kind's (`draft_kind=`, from training.drafts.registry):
this module imports no kind.

One optimizer step: the global batch (length-bucketed ids) is split over ranks, each rank's share
packed into micro-batches (training.feed.packing: samples end to end, no padding, at most
micro_batch_size * max_length tokens each); gradients accumulate over them and DDP all-reduces
them at the last one.
Every rank divides each TTT step's loss by the same global count of loss positions, so N ranks
give exactly the 1-rank gradient.

Entry point: `curator train --config FILE [key=value ...]`, or without the curator package (a
bare GPU node) `python -m training.trainer --config FILE [key=value ...]`, both under torchrun
for several GPUs. Both read the run with `train_config.load_run_config`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from training.io.atomic import output_file, output_folder, write_text
from training.feed.batches import Prefetcher, States, epoch_batches, training_ids
from training.train.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    read_meta,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    WEIGHTS,
)
from training.io.weights import read_weights
from training.runtime.distributed import DistInfo, all_reduce_sum, barrier, init_distributed, shutdown
from training.drafts.kind import BuildArgs, DraftKind, HeldOutArgs, StartDraft
from training.drafts.registry import kind_named
from training.errors import ModelMismatchError, StoreError, TrainingError
from training.train.nonfinite import NonFiniteWatch
from training.feed.packing import DeviceCopier, PackedBatch, pack_samples, plan_micro_batches
from training.capture.online import OnlineStates
from training.feed.engine import CaptureFactory, EngineFeedError, EngineStates, parse_bytes
from training.io.outlock import OutputLock
from training.storage.format import StoreMeta
from training.storage.reader import HiddenStateStore
from training.target.config import read_target_config
from training.io.tempfiles import remove_stale_checkpoints
from training.target.head import TargetHead
from training.train.config import TrainConfig, load_run_config
from training.target.draft_vocab import DraftVocab, build_vocab, count_tokens

MetricsCallback = Callable[[dict[str, Any]], None]
# Options that change how a run is watched or where it runs, never what it learns.
RESUME_INSENSITIVE = ("device", "log_every", "eval_every", "save_every", "out",
                      # where the engines are and how far ahead they capture: the same states either way
                      "engine", "engine_model", "engine_shared_dir", "engine_path_map", "engine_concurrency",
                      "engine_retries", "engine_timeout_s", "prefetch_samples", "prefetch_bytes", "cache_budget",
                      "cache_dir")
TRAIN_DEFAULTS = TrainConfig().to_dict()
LOCK_FILE = ".train.lock"


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


def _check_same_capture(train: StoreMeta, held: StoreMeta, path: str) -> None:
    """Refuse a held-out store captured differently from the training store."""
    fields = ("hidden_size", "aux_layer_ids", "vocab_size", "has_final")
    differ = [f for f in fields if getattr(train, f) != getattr(held, f)]
    if differ:
        raise TrainingError(f"eval_data {path} was captured differently from the training store: {', '.join(differ)}")


def data_fingerprint(store: States, train_ids: Sequence[str]) -> str:
    """Return a hash of what the run learns from: the capture's meta and every training id with its length."""
    h = hashlib.sha256(json.dumps({k: v for k, v in store.meta.to_json().items() if k != "extra"},
                                  sort_keys=True).encode())
    for sid in sorted(train_ids):
        h.update(f"{sid}\t{store.length(sid)}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _refuse_planted_links(run_dir: Path) -> None:
    """Raise OutputPathError for a link at `checkpoints/` or `metrics.jsonl` in an existing run folder.

    Checkpoints would be saved (and a killed run's half-saves deleted) wherever the folder link
    points, and metrics.jsonl is appended through its link; the other files are renamed into place,
    which replaces a link rather than writing through it.
    """
    if run_dir.is_dir():  # a new folder holds no link
        output_folder(run_dir, "checkpoints")
        output_file(run_dir, "metrics.jsonl")


def _prepare_run_dir(cfg: TrainConfig, resume: bool, dist_info: DistInfo) -> tuple[Path, Path | None]:
    run_dir = Path(cfg.out)
    _refuse_planted_links(run_dir)  # before a checkpoint is looked for through one
    ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
    if ckpt is not None and not resume:
        raise TrainingError(f"{run_dir} already has checkpoints; pass --resume to continue it or choose another out")
    if resume and ckpt is not None:
        saved = read_meta(ckpt).get("train_config", {})
        diffs = [
            f"{k}: {saved.get(k)!r} -> {v!r}"
            for k, v in cfg.to_dict().items()
            # a key the saved run predates has its default there (e.g. the EAGLE-3.1 norms: off)
            if k not in RESUME_INSENSITIVE and saved.get(k, TRAIN_DEFAULTS.get(k)) != v
        ]
        if diffs:
            raise TrainingError(f"--resume with a different config changes the run: {'; '.join(diffs)}")
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_checkpoints(run_dir / "checkpoints")  # half-written saves of a killed run
        write_text(run_dir / "train_config.json", json.dumps(cfg.to_dict(), indent=2))
    barrier()
    return run_dir, ckpt


def _resolve_vocab(
    cfg: TrainConfig, store: States, train_ids: list[str], run_dir: Path, dist_info: DistInfo, fresh: bool,
    init: StartDraft | None = None,
) -> DraftVocab:
    path = run_dir / "vocab.json"
    # Only a resumed run reuses its vocab; a fresh one (also in the folder of a run killed before
    # its first checkpoint) counts it again, so the file always describes these weights.
    if (fresh or not path.exists()) and dist_info.is_main:
        ids = train_ids[: cfg.vocab_max_samples] if cfg.vocab_max_samples else train_ids
        counts, n, skipped = count_tokens((store.tokens(sid) for sid in ids), store.meta.vocab_size)
        vocab = (init.vocab(counts, n, skipped) if init is not None  # a draft from elsewhere keeps its own
                 else build_vocab(counts, cfg.draft_vocab_size, samples_counted=n, samples_skipped=skipped))
        vocab.save(path)
    barrier()
    return DraftVocab.load(path)


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _logged_records(path: Path, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the last train and eval records logged at `step`: a finished run's result, read back on --resume."""
    found: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").split("\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step") == step and record.get("split") in ("train", "eval"):
                found[record["split"]] = record
    return found.get("train", {}), found.get("eval", {})


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines logged after `step` (a resumed run logs them again)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                keep.append(line)
        except (ValueError, AttributeError):
            continue  # a line cut by the kill: dropped
    write_text(path, "".join(line + "\n" for line in keep))


@dataclass
class Setup:
    """Everything the loop needs, built from the config by `setup`."""

    cfg: TrainConfig
    dist: DistInfo
    device: torch.device
    use_bf16: bool
    data_dtype: torch.dtype
    store: States
    eval_store: States
    head: TargetHead
    run_dir: Path
    train_ids: list[str]
    eval_ids: list[str]
    vocab: DraftVocab
    kind: DraftKind
    draft: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    total_steps: int
    batches_per_epoch: int
    meta: dict[str, Any]  # what every checkpoint of the run records
    step: int = 0  # where the loop starts (a resumed run's checkpoint step)
    pending: torch.Tensor | None = None  # metric sums not yet logged at that step
    pending_tokens: int = 0


def open_states(cfg: TrainConfig, device: torch.device, dist_info: DistInfo,
                capture_factory: CaptureFactory | None) -> States:
    """Return the run's states: a store, the target beside the draft (online), or the engines (engine)."""
    if cfg.online:
        return OnlineStates.open(cfg.target, cfg.data, device=device)
    if cfg.engine:
        if capture_factory is None:
            raise TrainingError(
                "engine-fed training (engine=...) draws states through curator's vLLM client "
                "(curator.hidden.engine_feed); run it with `curator train` (also under torchrun), or capture a store "
                "with `curator hidden-states --backend vllm` for `python -m training.trainer`")
        return EngineStates.open(
            cfg.target, cfg.data, capture_factory, run_dir=Path(cfg.out), rank=dist_info.rank,
            max_length=cfg.max_length, window_samples=cfg.prefetch_samples,
            window_bytes=parse_bytes(cfg.prefetch_bytes),
            cache_budget=parse_bytes(cfg.cache_budget) // dist_info.world_size, cache_dir=cfg.cache_dir or None)
    # fp8 stores are read as stored and dequantised on the training device (Batch.to)
    return HiddenStateStore.open(cfg.data, dequantize=False)


def setup(cfg: TrainConfig, resume: bool = False, capture_factory: CaptureFactory | None = None) -> Setup:
    """Return the run's data, draft and optimizer, restored from its latest checkpoint when resuming."""
    kind = kind_named(cfg.draft_kind)  # an unknown kind is named before anything is opened
    dist_info = init_distributed(cfg.device)
    device, world = dist_info.device, dist_info.world_size
    if cfg.global_batch_size % world:
        raise TrainingError(f"global_batch_size {cfg.global_batch_size} must be a multiple of the {world} ranks")
    use_bf16 = cfg.bf16 if cfg.bf16 is not None else device.type == "cuda"
    data_dtype = torch.bfloat16 if use_bf16 else torch.float32

    store = open_states(cfg, device, dist_info, capture_factory)
    eval_store: States = store
    if cfg.eval_data:  # cheap inputs first: a wrong path is named before the target's head is read
        eval_store = HiddenStateStore.open(cfg.eval_data, dequantize=False)
        _check_same_capture(store.meta, eval_store.meta, cfg.eval_data)
    target_cfg = read_target_config(cfg.target)
    head = TargetHead.from_pretrained(cfg.target, dtype=data_dtype, device=device)
    _check_inputs(store.meta, target_cfg, head, store)
    train_ids, eval_ids = training_ids(store.ids(), separate_eval=bool(cfg.eval_data), eval_fraction=cfg.eval_fraction,
                                       eval_max_samples=cfg.eval_max_samples, max_train_samples=cfg.max_train_samples)
    if cfg.eval_data:
        eval_ids = sorted(eval_store.ids())[: cfg.eval_max_samples]
    if len(train_ids) < cfg.global_batch_size:
        raise TrainingError(
            f"{len(train_ids)} training samples are fewer than global_batch_size {cfg.global_batch_size}"
        )
    run_dir, ckpt = _prepare_run_dir(cfg, resume, dist_info)  # the inputs are checked: now the run folder
    fingerprint = data_fingerprint(store, train_ids)
    if ckpt is not None:
        saved = read_meta(ckpt).get("data_fingerprint")
        if saved and saved != fingerprint:
            raise TrainingError(f"--resume on other data: {cfg.data} no longer holds the samples {ckpt} trained on")
    if ckpt is None and dist_info.is_main:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # left by a run killed before its first checkpoint
    train_args = cfg.to_dict()
    init = (kind.start_from(cfg.init_from, cfg.target, target_cfg, head.vocab_size, list(store.meta.aux_layer_ids),
                            train_args) if cfg.init_from and ckpt is None else None)
    vocab = _resolve_vocab(cfg, store, train_ids, run_dir, dist_info, fresh=ckpt is None, init=init)

    torch.manual_seed(cfg.seed)
    draft = kind.build(BuildArgs(
        train_args, target_cfg, head, vocab,
        aux_layer_ids=store.meta.aux_layer_ids,  # normalised to training.target.layers.CONVENTION when opened
        start=init,
        # a run started from elsewhere keeps that draft's shape when it resumes
        resumed_config=read_meta(ckpt)["draft_config"] if cfg.init_from and ckpt is not None else None))
    draft.to(device)

    batches_per_epoch = len(train_ids) // cfg.global_batch_size
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * batches_per_epoch))
    params = [p for p in draft.parameters() if p.requires_grad]
    # fused: one kernel over all parameters on the GPU (same update; foreach on the CPU)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay,
                                  fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, cfg.warmup_ratio, cfg.min_lr_ratio))
    meta = {
        "draft_kind": kind.name,
        "draft_config": kind.config_of(draft),
        "target_dir": str(Path(cfg.target).resolve()),
        "target_config": {k: target_cfg.get(k) for k in ("architectures", "model_type", "hidden_size",
                                                           "num_hidden_layers", "vocab_size", "_name_or_path")},
        "store": {**store.meta.to_json(), "path": str(Path(cfg.data).resolve()), "samples": len(store)},
        "data_fingerprint": fingerprint,
        # the held-out split, so that evaluation never has to be told it again
        "split": {"eval_data": str(Path(cfg.eval_data).resolve()) if cfg.eval_data else "",
                  "eval_fraction": cfg.eval_fraction, "eval_ids": eval_ids, "train_samples": len(train_ids)},
        "vocab": {k: v for k, v in vocab.to_json().items() if k != "draft_ids"},
        "ttt_steps": cfg.ttt_steps,
        "train_config": cfg.to_dict(),
    }
    run = Setup(cfg, dist_info, device, use_bf16, data_dtype, store, eval_store, head, run_dir, train_ids, eval_ids,
                vocab, kind, draft, optimizer, scheduler, total_steps, batches_per_epoch, meta)
    run.pending = torch.zeros(cfg.ttt_steps, kind.n_sums, dtype=torch.float64)
    if ckpt is not None:
        draft.load_state_dict(read_weights(ckpt / WEIGHTS), strict=False)
        state = load_trainer_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        restore_rng_state(state["rng"])
        run.step = int(state["step"])
        saved = state["pending_sums"].double()
        run.pending[:, : saved.shape[1]] = saved  # a checkpoint from before a sum was added lacks its column
        run.pending_tokens = int(state["pending_tokens"])
        if dist_info.is_main:
            _truncate_metrics(run_dir / "metrics.jsonl", run.step)
    return run


def run_lock(out: str | Path) -> OutputLock | nullcontext[None]:
    """Return the lock that makes one run at a time the writer of `out` (taken by rank 0; other ranks follow it)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return nullcontext()
    return OutputLock(out, LOCK_FILE, "`curator train`")


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    on_metrics: MetricsCallback | None = None,
    stop_after_steps: int | None = None,
    capture_factory: CaptureFactory | None = None,
) -> TrainResult:
    """Train a draft as `cfg` says; return where its final checkpoint is and the last metrics.

    `resume` continues the run in `cfg.out` from its latest checkpoint exactly (weights,
    optimizer, scheduler, RNG, data position, pending metric sums). `stop_after_steps` ends this
    session after that many optimizer steps with a checkpoint, for time-sliced jobs. A second run
    into the same `out` while one is live is refused (OutputBusyError naming its PID); a loss,
    weights or states that turn NaN/inf stop the run (DivergedError, StoreIntegrityError) before
    anything non-finite is saved.
    """
    with run_lock(cfg.out):
        return _train(cfg, resume=resume, on_metrics=on_metrics, stop_after_steps=stop_after_steps,
                      capture_factory=capture_factory)


def _train(
    cfg: TrainConfig, *, resume: bool, on_metrics: MetricsCallback | None, stop_after_steps: int | None,
    capture_factory: CaptureFactory | None = None,
) -> TrainResult:
    run = setup(cfg, resume, capture_factory)
    try:
        return _run(cfg, run, on_metrics=on_metrics, stop_after_steps=stop_after_steps)
    finally:
        if isinstance(run.store, EngineStates):
            run.store.close()  # after the final eval, which captures the held-out samples


def _run(cfg: TrainConfig, run: Setup, *, on_metrics: MetricsCallback | None,
         stop_after_steps: int | None) -> TrainResult:
    kind, draft, store, head, device, dist_info = run.kind, run.draft, run.store, run.head, run.device, run.dist
    world, rank = dist_info.world_size, dist_info.rank
    optimizer, scheduler, total_steps, batches_per_epoch = run.optimizer, run.scheduler, run.total_steps, run.batches_per_epoch
    params = [p for p in draft.parameters() if p.requires_grad]
    step, pending_tokens = run.step, run.pending_tokens
    assert run.pending is not None
    # the metric sums and grad norms stay on the device between logs: read where the loop syncs anyway
    pending = run.pending.to(device, copy=True)
    resumed = step > 0

    kind.prepare(device)
    n_sums = kind.n_sums  # asked once: the kind's answer does not change inside the loop
    objective: nn.Module = kind.objective(draft)
    if dist_info.enabled:
        objective = nn.parallel.DistributedDataParallel(
            objective, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
        )
    weights = torch.tensor([cfg.step_weight**k for k in range(cfg.ttt_steps)], dtype=torch.float64)
    lengths = {sid: min(store.length(sid), cfg.max_length) for sid in run.train_ids}
    watch = NonFiniteWatch(store, {n: p for n, p in draft.named_parameters() if p.requires_grad}, device, step)

    def save(at_step: int) -> Path:
        path = run.run_dir / "checkpoints" / f"step-{at_step:07d}"
        watch.check(at_step, pending, scheduler.get_last_lr()[0])  # never a checkpoint of NaNs
        if dist_info.is_main:
            path = save_checkpoint(run.run_dir, kind.trainable_weights(draft), {**run.meta, "step": at_step}, {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(),
                "step": at_step,
                "epoch": at_step // batches_per_epoch,
                "batch_in_epoch": at_step % batches_per_epoch,
                "pending_sums": pending.to("cpu", copy=True),
                "pending_tokens": pending_tokens,
            }, check_finite=False)  # watch.check just refused non-finite weights
        barrier()
        return path

    def emit(record: dict[str, Any]) -> None:
        if dist_info.is_main:
            _append_jsonl(run.run_dir / "metrics.jsonl", record)
            if on_metrics is not None:
                on_metrics(record)

    def run_eval(at_step: int) -> dict[str, Any]:
        if not run.eval_ids:
            return {}
        figures = kind.held_out(draft, run.eval_store, run.eval_ids, head, HeldOutArgs(
            cfg.ttt_steps, cfg.step_weight, rank=rank, world=world, reduce=all_reduce_sum,
            batch_size=cfg.micro_batch_size, max_length=cfg.max_length, autocast=run.use_bf16))
        record = {"split": "eval", "step": at_step, **figures, "samples": len(run.eval_ids)}
        emit(record)
        return record

    last_train: dict[str, Any] = {}
    last_eval: dict[str, Any] = {}
    last_saved = step if resumed else -1
    session_steps = 0
    epoch_cache: tuple[int, list[list[str]]] = (-1, [])
    t_log = time.perf_counter()
    grad_norms: list[torch.Tensor] = []  # each step's, on the device, read at the next log
    draft.train()
    epoch_lock = threading.Lock()

    def load_step(at_step: int) -> list[PackedBatch]:
        nonlocal epoch_cache
        epoch, index = divmod(at_step, batches_per_epoch)
        with epoch_lock:
            if epoch_cache[0] != epoch:
                epoch_cache = (epoch, epoch_batches(run.train_ids, lengths, cfg.global_batch_size, cfg.bucket_batches,
                                                    cfg.seed, epoch))
            local = epoch_cache[1][index][rank::world]
        # packed, no padding: each micro-batch holds at most what a padded one of micro_batch_size could
        micro = plan_micro_batches(local, lengths, cfg.micro_batch_size * cfg.max_length)
        # engine-fed: this step's captures
        source: Any = engine.for_step(at_step) if engine is not None else store
        packed = [pack_samples(source, ids, cfg.max_length) for ids in micro]
        return [b.pin_memory() for b in packed] if device.type == "cuda" else packed

    def rank_schedule(start: int) -> Iterator[tuple[int, list[str]]]:
        """Yield (step, this rank's ids in the order load_step reads them) from `start` on: what the engines capture."""
        order: tuple[int, list[list[str]]] = (-1, [])
        for at_step in range(start, total_steps):
            epoch, index = divmod(at_step, batches_per_epoch)
            if order[0] != epoch:
                order = (epoch, epoch_batches(run.train_ids, lengths, cfg.global_batch_size, cfg.bucket_batches,
                                              cfg.seed, epoch))
            micro = plan_micro_batches(order[1][index][rank::world], lengths, cfg.micro_batch_size * cfg.max_length)
            yield at_step, [sid for ids in micro for sid in ids]

    engine: EngineStates | None = store if isinstance(store, EngineStates) else None
    if engine is not None:
        engine.start(rank_schedule(step))

    # Online states run the target on the GPU: read those in the loop, not on a second thread.
    prefetch = Prefetcher(load_step, total_steps, depth=0 if cfg.online else 2)
    copier = DeviceCopier(device, run.data_dtype)
    try:
        while step < total_steps:
            loaded = prefetch.get(step)
            # every rank divides by the same global count of loss positions per TTT step
            counts = all_reduce_sum(torch.stack([b.step_counts(cfg.ttt_steps) for b in loaded]).sum(0).to(device))
            step_scale = (weights.to(device) / counts.clamp(min=1) * world).float()
            optimizer.zero_grad(set_to_none=True)
            step_sums = torch.zeros(cfg.ttt_steps, n_sums, dtype=torch.float64, device=device)
            moving = copier.start(loaded[0])
            for i, cpu_batch in enumerate(loaded):
                batch = copier.wait(moving)
                if i + 1 < len(loaded):
                    moving = copier.start(loaded[i + 1])  # copied while this one computes
                watch.watch(batch)
                sig = kind.targets(batch, head, draft)
                sync = i == len(loaded) - 1 or not dist_info.enabled
                ctx = nullcontext() if sync else objective.no_sync()  # type: ignore[operator]
                with ctx:
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.use_bf16):
                        loss, sums = kind.step(objective, batch, sig, step_scale, cfg.ttt_steps)
                    loss.backward()
                step_sums += sums  # on the device: no host sync inside the step
                pending_tokens += cpu_batch.tokens
            pending += step_sums  # no host sync per step: read at log and save time
            grad_norms.append(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip).detach())
            optimizer.step()
            scheduler.step()
            if engine is not None:
                engine.release(step)  # its samples leave the window: the engines may capture further ahead
            step += 1
            session_steps += 1
            if step % cfg.log_every == 0 or step == total_steps:
                totals = all_reduce_sum(pending.clone()).cpu()
                norms = torch.stack(grad_norms).tolist()
                tokens = int(all_reduce_sum(torch.tensor([pending_tokens], device=device)).item())
                watch.check(step, totals, scheduler.get_last_lr()[0])
                elapsed = time.perf_counter() - t_log
                last_train = {
                    "split": "train", "step": step, "epoch": round(step / batches_per_epoch, 4),
                    "lr": scheduler.get_last_lr()[0], **kind.summarize(totals, cfg.step_weight),
                    "grad_norm": sum(norms) / len(norms), "tokens": tokens,
                    "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0, "total_steps": total_steps,
                }
                if engine is not None:
                    last_train["feed"] = engine.stats.to_json()  # this rank's: captures, cache, waits, window
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
    except EngineFeedError:
        # the engines cannot go on: keep every finished step, so that --resume starts right after it
        if engine is not None and not dist_info.enabled and step > max(last_saved, 0):
            engine.stop_schedule()
            save(step)
        raise
    finally:
        if engine is not None:
            engine.stop_schedule()  # before the read-ahead thread, which may be waiting for a capture
        prefetch.close()
    if step == total_steps and resumed and session_steps == 0:
        # a finished run resumed: its final eval is logged already; read it back, do not log it again
        last_train, last_eval = _logged_records(run.run_dir / "metrics.jsonl", step)
    elif step == total_steps:
        last_eval = run_eval(step) or last_eval
    path = save(step) if last_saved != step else run.run_dir / "checkpoints" / f"step-{step:07d}"
    if dist_info.is_main and step == total_steps:
        write_text(run.run_dir / "summary.json", json.dumps(
            {"step": step, "train": last_train, "eval": last_eval, "vocab": run.meta["vocab"],
             # absolute: readers (curator forecast --run, export) open it from any cwd, not the one trained in
             "checkpoint": str(Path(path).resolve())}, indent=2))
    return TrainResult(run.run_dir, path, step, last_train, last_eval, run.meta["vocab"])


def _local_rank_main(rank: int, world: int, port: int, cfg_dict: dict[str, Any], threads: int | None,
                     capture_factory: CaptureFactory | None = None) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if threads:
        torch.set_num_threads(threads)
    try:
        train(TrainConfig.from_dict(cfg_dict), capture_factory=capture_factory)
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()


def train_local_ranks(cfg: TrainConfig, world_size: int, *, threads_per_rank: int | None = None,
                      capture_factory: CaptureFactory | None = None) -> None:
    """Train `cfg` on `world_size` processes of this machine, as torchrun would start them.

    For notebooks and tests; on a cluster use torchrun with either entry point.
    """
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_local_rank_main, args=(world_size, port, cfg.to_dict(), threads_per_rank, capture_factory),
             nprocs=world_size, join=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Train from a config file without the curator package (a bare GPU node), under torchrun or not.

    `python -m training.trainer --config run.yaml [key=value ...] [--resume]`: the same arguments
    and config reading as `curator train`; progress goes to stdout as JSON lines.
    """
    parser = argparse.ArgumentParser(prog="python -m training.trainer", description=main.__doc__)
    parser.add_argument("-c", "--config", default=None, help="YAML or JSON file with the run's options")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="options over the file's, e.g. max_steps=600")
    parser.add_argument("--resume", action="store_true", help="continue the run in `out` from its latest checkpoint")
    parser.add_argument("--stop-after", type=int, default=None, help="end this session after N steps (checkpointed)")
    args = parser.parse_args(argv)
    is_main = int(os.environ.get("RANK", "0")) == 0

    def log(record: dict[str, Any]) -> None:
        keep = ("split", "step", "total_steps", "loss", "acc", "accept_length")
        print(json.dumps({k: record[k] for k in keep if k in record}), flush=True)

    try:
        cfg = load_run_config(args.config, args.overrides)
        result = train(cfg, resume=args.resume, on_metrics=log if is_main else None, stop_after_steps=args.stop_after)
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
