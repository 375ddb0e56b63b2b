"""Capture the target's aux-layer and final hidden states with transformers, into a shard store.

Layer ids are numbered as training.target.layers says (id L is the *input* of decoder layer L, which is
`output_hidden_states[L]` in transformers); the default [2, N//2, N-3] is what SGLang captures for
an EAGLE-3 draft by default (Kimi-K2.5, N=61: [2, 30, 58]).
The "final" state is the last layer's output after the final norm (`last_hidden_state`, equal to
`output_hidden_states[-1]` in HF Llama): the state the target's lm_head turns into logits.

States are taken by forward pre-hooks on the decoder layers, so only the requested layers are
kept in memory, and the model's base (not the LM head) is run, so no logits are computed.

Data parallel: run under torchrun (`torchrun --nproc-per-node 8 -m training.hidden_states ...`).
Each rank takes the samples whose id hashes to it, writes its own shards and index part; rank 0
merges the index at the end. Ranks skip everything any earlier run stored, so a re-run with another
world size resumes correctly.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from training.records.chat_tokens import (
    GenerationReadStats,
    MalformedRecordError,
    chat_template_sha256,
    iter_generation,
    tokenize_rows,
    tokenizer_sha256,
)
from training.runtime.distributed import init_distributed
from training.errors import ModelMismatchError, TrainingError
from training.target.layers import CONVENTION, check_layer_ids, default_aux_layers
from training.io.outlock import OutputBusyError, OutputLock
from training.target.config import text_part
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.fp8 import quantize_fp8
from training.storage.index import merge_index
from training.storage.writer import StoreWriter, claim_store

def text_config(config: Any) -> Any:
    """Return the language-model part of a (possibly multimodal) transformers config."""
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


def _base_and_layers(model: Any) -> tuple[Any, Any, Any]:
    base = getattr(model, "model", model)
    base = getattr(base, "language_model", base)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise ModelMismatchError(
            f"{type(model).__name__} has no `.model.layers` and `.model.norm`; only decoder-only causal LMs are supported"
        )
    return base, layers, norm


@dataclass
class CapturedStates:
    """States of one batch: aux [B, T, n_aux*H] (layer order as requested), final [B, T, H] or None."""

    aux: torch.Tensor
    final: torch.Tensor | None


@torch.no_grad()
def capture_batch(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer_ids: list[int],
    with_final: bool = True,
) -> CapturedStates:
    """Return the aux states (inputs of `layer_ids`) and the final normed state for a batch; writes nothing.

    This is the online mode: the trainer calls it on the target beside the draft.
    """
    base, layers, norm = _base_and_layers(model)
    n = len(layers)
    layer_ids = check_layer_ids(layer_ids, n)
    captured: dict[int, torch.Tensor] = {}

    def keep(idx: int) -> Callable[..., None]:
        def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
            captured[idx] = args[0] if args else kwargs["hidden_states"]

        return hook

    # Id N (the last layer's output, pre-norm) is the input of the final norm.
    modules = {i: (layers[i] if i < n else norm) for i in set(layer_ids)}
    handles = [m.register_forward_pre_hook(keep(i), with_kwargs=True) for i, m in modules.items()]
    try:
        out = base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    final = out.last_hidden_state if with_final else None
    device = final.device if final is not None else captured[layer_ids[-1]].device
    aux = torch.cat([captured[i].to(device) for i in layer_ids], dim=-1)
    return CapturedStates(aux=aux, final=final)


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Return batches of indices, longest first, each with (count x longest) <= batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * longest > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def owns(sample_id: str, rank: int, world_size: int) -> bool:
    """Return whether `rank` of `world_size` captures `sample_id` (a stable hash, same on every run)."""
    if world_size <= 1:
        return True
    return int(hashlib.sha256(sample_id.encode("utf-8")).hexdigest()[:16], 16) % world_size == rank


@dataclass
class PreparedSample:
    """A tokenised sample, ready for a forward pass."""

    id: str
    category: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    mode: str = "text"  # "token": the target's stored ids; "text": re-rendered from the record's text


@dataclass
class ExtractStats:
    """What an extraction run did (one rank's view, or the sum over ranks)."""

    records: int = 0
    already_done: int = 0
    other_rank: int = 0
    malformed: int = 0
    no_loss_tokens: int = 0
    truncated: int = 0
    stored: int = 0
    nonfinite: int = 0
    failed: int = 0  # engine requests that failed for good (vLLM backend)
    tokens: int = 0
    loss_tokens: int = 0
    bytes_written: int = 0
    wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Return stored tokens per second of wall time."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def skipped(self) -> int:
        """Return the samples not stored for a reason the user should know about."""
        return self.malformed + self.no_loss_tokens + self.nonfinite + self.failed

    def add(self, other: ExtractStats) -> None:
        """Accumulate another rank's counts (wall time: the slowest rank)."""
        for name, value in asdict(other).items():
            if name == "wall_s":
                self.wall_s = max(self.wall_s, value)
            else:
                setattr(self, name, getattr(self, name) + value)


def prepare_samples(
    records: Iterable[dict[str, Any]],
    tokenizer: Any,
    stats: ExtractStats,
    *,
    done: set[str],
    max_len: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    vocab_size: int | None = None,
) -> Iterator[PreparedSample]:
    """Yield this rank's not-yet-stored records, tokenised with the chat template; count the rest
    (a record with a token id the target cannot take, at or past `vocab_size`, is malformed)."""
    seen: set[str] = set()
    for rec in records:
        stats.records += 1
        sid = rec["id"]
        # Ownership first: another rank may store its share while this one is still reading.
        if not owns(sid, rank, world_size):
            stats.other_rank += 1
            continue
        # A record of one answer is one row under its own id. One of several answers may have
        # been split into rows `id#k` stored in other shards than `id`'s (batches are grouped by
        # length), so a killed run can leave some of them: such a record is looked at row by row.
        answers = sum(1 for m in rec.get("messages") or [] if isinstance(m, dict) and m.get("train"))
        if sid in seen or (sid in done and answers <= 1):
            stats.already_done += 1
            continue
        seen.add(sid)
        try:
            rows = tokenize_rows(rec, tokenizer, max_len=max_len, vocab_size=vocab_size)  # ids checked in range
        except MalformedRecordError:
            stats.malformed += 1
            continue
        # One row per generation whose context the template re-renders differently (stored ids
        # are used as they are); the row holding the last answer keeps the record's id.
        for toks in rows:
            if sid + toks.suffix in done:
                stats.already_done += 1
                continue
            if not bool(toks.loss_mask.any()):
                stats.no_loss_tokens += 1  # max_len cut every answer off: nothing to learn from it
                continue
            stats.truncated += int(toks.truncated)
            yield PreparedSample(sid + toks.suffix, str(rec.get("category", "")), toks.input_ids, toks.loss_mask,
                                 toks.mode)


def store_meta(
    config: Any,
    tokenizer: Any,
    *,
    target: str,
    layer_ids: list[int] | None,
    dtype: str,
    has_final: bool,
    extra: dict[str, Any] | None = None,
) -> StoreMeta:
    """Return the store metadata for a target config (transformers config or its dict) and tokenizer."""
    cfg = text_part(config if isinstance(config, dict) else text_config(config).to_dict())
    n = int(cfg["num_hidden_layers"])
    ids = check_layer_ids(layer_ids if layer_ids else default_aux_layers(n), n)
    return StoreMeta(
        target=target,
        hidden_size=int(cfg["hidden_size"]),
        num_layers=n,
        vocab_size=int(cfg["vocab_size"]),
        aux_layer_ids=ids,
        layer_convention=CONVENTION,
        dtype=dtype,
        has_final=has_final,
        chat_template_sha256=chat_template_sha256(tokenizer),
        tokenizer_sha256=tokenizer_sha256(tokenizer),
        extra=dict(extra or {}),
    )


class BackgroundWriter:
    """Runs StoreWriter.add on a thread, so shard serialisation and disk writes overlap the next forward."""

    def __init__(self, writer: StoreWriter, depth: int = 4) -> None:
        self.writer = writer
        self._queue: queue.Queue[tuple[list[HiddenStateSample], HostStates | None] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.stored = 0
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue
            batch, host = item
            try:
                if host is not None:
                    host.wait()  # the copy from the GPU may still be in flight
                for s in batch:
                    self.stored += int(self.writer.add(s))
            except BaseException as exc:  # re-raised in the caller's thread by put()/close()
                self._error = exc

    def put(self, samples: list[HiddenStateSample], host: HostStates | None = None) -> None:
        """Queue samples (views of `host`, when given: waited on first); re-raise a writer failure."""
        if self._error is not None:
            raise self._error
        self._queue.put((samples, host))

    def close(self) -> None:
        """Wait for every queued sample, flush the last shard, re-raise a failure."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self.writer.close()


def extract(
    model: Any,
    tokenizer: Any,
    records: Iterable[dict[str, Any]],
    out_dir: str | Path,
    meta: StoreMeta,
    *,
    max_len: int | None = None,
    batch_tokens: int = 16384,
    window: int = 512,
    rank: int = 0,
    world_size: int = 1,
    shard_max_bytes: int = 512 * 1024**2,
    on_batch: Callable[[int, int], None] | None = None,
) -> ExtractStats:
    """Capture and store every not-yet-stored record of this rank's share; return the run's counts.

    Records are tokenised in windows of `window` samples, and each window runs in length-sorted
    batches of at most `batch_tokens` padded tokens. `on_batch(samples, tokens)` reports progress.
    """
    stats = ExtractStats()
    start = time.perf_counter()
    device = next(model.parameters()).device
    n_aux = len(meta.aux_layer_ids)
    flush_workers = 3 if device.type == "cuda" else 0
    with StoreWriter(out_dir, meta, shard_max_bytes=shard_max_bytes, writer_id=f"r{rank}", flush_workers=flush_workers) as writer:
        bg = BackgroundWriter(writer)
        copier = HostCopier()
        try:
            samples = prepare_samples(
                records, tokenizer, stats, done=writer.done_ids(), max_len=max_len, rank=rank, world_size=world_size,
                vocab_size=meta.vocab_size,
            )
            for chunk in _windows(samples, window):
                for batch in length_batches([len(s.input_ids) for s in chunk], batch_tokens):
                    items = [chunk[i] for i in batch]
                    ids, mask = pad_batch([s.input_ids for s in items], tokenizer.pad_token_id or 0)
                    states = capture_batch(model, ids.to(device), mask.to(device), meta.aux_layer_ids, meta.has_final)
                    if states.aux.shape[-1] != n_aux * meta.hidden_size:
                        raise ModelMismatchError(
                            f"the model's hidden size {states.aux.shape[-1] // n_aux} differs from the store's "
                            f"{meta.hidden_size}; use another --out directory for this target"
                        )
                    finite = sample_finite(states, [len(s.input_ids) for s in items])
                    host = copier(states, meta)
                    out = []
                    for b, s in enumerate(items):
                        t = len(s.input_ids)
                        out.append(HiddenStateSample(id=s.id, input_ids=s.input_ids, loss_mask=s.loss_mask,
                                                     category=s.category, mode=s.mode, finite=finite[b], **host.rows(b, t)))
                        stats.loss_tokens += int(s.loss_mask.sum())
                    bg.put(out, host)
                    if on_batch is not None:
                        on_batch(len(items), sum(len(s.input_ids) for s in items))
        finally:
            bg.close()
            # The pinned buffers stay cached (rounded up to powers of two) after the run: give
            # them back, as a process that goes on to train wants that memory.
            if device.type == "cuda" and hasattr(torch._C, "_host_emptyCache"):
                torch._C._host_emptyCache()
        stats.stored = bg.stored
        stats.nonfinite = writer.skipped_nonfinite
        stats.bytes_written = writer.bytes_written
        stats.tokens = writer.stored_tokens
    stats.wall_s = time.perf_counter() - start
    return stats


@dataclass
class HostStates:
    """A batch's states on the host, as the store keeps them: bf16, or fp8 values with scales."""

    aux: torch.Tensor  # (B, T, n_aux*H)
    final: torch.Tensor | None  # (B, T, H)
    aux_scale: torch.Tensor | None = None  # (B, T, n_aux) float32, fp8 only
    final_scale: torch.Tensor | None = None  # (B, T, 1)
    # Set when the copy from the GPU is still in flight: wait on it before reading the tensors.
    ready: Any = None

    def rows(self, b: int, t: int) -> dict[str, torch.Tensor | None]:
        """Return sample `b`'s first `t` tokens as HiddenStateSample fields (views: no copy)."""
        return {name: (x[b, :t] if x is not None else None)
                for name, x in (("aux", self.aux), ("final", self.final), ("aux_scale", self.aux_scale),
                                ("final_scale", self.final_scale))}

    def wait(self) -> None:
        """Block until the tensors hold the copied values."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None


class HostCopier:
    """Copies a batch's states from the GPU into pinned host memory on a side stream.

    A plain `.to("cpu")` of ~0.5 GB blocks the Python thread for the copy into freshly
    allocated pageable memory (page faults included), with the GPU idle until the next batch is
    queued. Here the copy is queued behind the forward on its own stream, into pinned buffers
    that torch's caching host allocator recycles, and the next forward starts at once; the
    writer thread waits on the copy's event (`HostStates.wait`) before it touches the bytes.
    """

    def __init__(self) -> None:
        # One side stream per GPU: with device_map the states come off the model's last GPU.
        self._streams: dict[int, torch.cuda.Stream] = {}

    @staticmethod
    def _copy(t: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        t.record_stream(stream)  # keep the GPU block alive until the copy has read it
        return host

    def __call__(self, states: CapturedStates, meta: StoreMeta) -> HostStates:
        """Return the batch as the store keeps it; an fp8 store's states are quantised first,
        where they are (the GPU), so half the bytes cross to the host and the writer does less."""
        if meta.dtype != "fp8":
            parts = {"aux": states.aux, "final": states.final}
        else:
            B, T, W = states.aux.shape
            q, scale = quantize_fp8(states.aux.reshape(B * T, W), len(meta.aux_layer_ids))
            parts = {"aux": q.reshape(B, T, W), "aux_scale": scale.reshape(B, T, -1), "final": None}
            if states.final is not None:
                fq, fscale = quantize_fp8(states.final.reshape(B * T, -1), 1)
                parts.update(final=fq.reshape(B, T, -1), final_scale=fscale.reshape(B, T, 1))
        device = states.aux.device
        if device.type != "cuda":
            return HostStates(**{k: (v.to("cpu") if v is not None else None) for k, v in parts.items()})
        with torch.cuda.device(device):
            stream = self._streams.get(device.index)
            if stream is None:
                stream = self._streams[device.index] = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                host = {k: (self._copy(v, stream) if v is not None else None) for k, v in parts.items()}
                # blocking: the writer thread sleeps on it instead of spinning a core the
                # shard threads need
                event = torch.cuda.Event(blocking=True)
                event.record(stream)
        return HostStates(**host, ready=event)


def sample_finite(states: CapturedStates, lengths: list[int]) -> list[bool]:
    """Return, per sample of a batch, whether its states (up to its length) are all finite.

    One reduction on the device where the states are, instead of a pass over the host copy.
    """
    bad = ~torch.isfinite(states.aux).all(dim=-1)  # (B, T)
    if states.final is not None:
        bad |= ~torch.isfinite(states.final).all(dim=-1)
    positions = torch.arange(bad.shape[1], device=bad.device)[None, :]
    valid = positions < torch.tensor(lengths, device=bad.device)[:, None]
    return (~(bad & valid).any(dim=1)).tolist()


def _windows(items: Iterable[PreparedSample], size: int) -> Iterator[list[PreparedSample]]:
    chunk: list[PreparedSample] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def pad_batch(seqs: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return right-padded ids [B, T] and attention mask [B, T]."""
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def load_target(model_path: str | Path, device: str | torch.device | None = None) -> tuple[Any, Any]:
    """Return (model in eval mode, tokenizer): bf16 on GPU, float32 on CPU, sdpa attention.

    With several GPUs visible to one process (no torchrun) and accelerate installed, the model is
    spread over them with device_map="auto", for targets larger than one GPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_path)
    if not (path / "config.json").exists():
        raise TrainingError(f"{path} has no config.json; pass the target model's directory")
    tokenizer = AutoTokenizer.from_pretrained(path)
    cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if cuda else torch.float32, "attn_implementation": "sdpa"}
    spread = cuda and device is None and torch.cuda.device_count() > 1 and importlib.util.find_spec("accelerate")
    if spread:
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if not spread:
        model.to(device or ("cuda" if cuda else "cpu"))
    model.eval()
    return model, tokenizer


def finish_ranks(stats: ExtractStats, out_dir: str | Path, world_size: int) -> ExtractStats:
    """Wait for every rank, merge the index on rank 0, and return the counts summed over ranks."""
    if world_size > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, asdict(stats))
        total = ExtractStats()
        for g in gathered:
            total.add(ExtractStats(**g))
        if dist.get_rank() == 0:
            merge_index(out_dir)
        dist.barrier()
        return total
    merge_index(out_dir)
    return stats


def claim_for_ranks(out_dir: str | Path, rank: int, world_size: int) -> OutputLock | None:
    """Return the store's lock, held by rank 0 (None elsewhere); every rank raises when another run writes the store."""
    lock, refusal = None, None
    if rank == 0:
        try:
            lock = claim_store(out_dir)
        except OutputBusyError as exc:
            refusal = str(exc)
    if world_size > 1:
        import torch.distributed as dist

        box = [refusal]
        dist.broadcast_object_list(box, src=0)
        refusal = box[0]
    if refusal is not None:
        raise OutputBusyError(refusal)
    return lock


def run(
    model_path: str | Path,
    gen_dir: str | Path,
    out_dir: str | Path,
    *,
    layer_ids: list[int] | None = None,
    dtype: str = "bf16",
    has_final: bool = True,
    max_len: int | None = None,
    batch_tokens: int = 16384,
    read_stats: GenerationReadStats | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> ExtractStats:
    """Capture a generation output into a store at `out_dir` (torchrun-aware); return the counts."""
    info = init_distributed()  # under torchrun: joins the group, this rank's GPU
    rank, world, local = info.rank, info.world_size, info.local_rank
    # Taken before the target loads, so a refused run costs nothing; held until the index is merged.
    lock = claim_for_ranks(out_dir, rank, world)
    try:
        device = f"cuda:{local}" if world > 1 and torch.cuda.is_available() else None
        model, tokenizer = load_target(model_path, device)
        meta = store_meta(
            model.config,
            tokenizer,
            target=str(model_path),
            layer_ids=layer_ids,
            dtype=dtype,
            has_final=has_final,
            extra={"backend": "transformers", "max_len": max_len},
        )
        stats = extract(
            model,
            tokenizer,
            iter_generation(gen_dir, read_stats),
            out_dir,
            meta,
            max_len=max_len,
            batch_tokens=batch_tokens,
            rank=rank,
            world_size=world,
            on_batch=on_batch,
        )
        return finish_ranks(stats, out_dir, world)
    finally:
        if lock is not None:
            lock.release()


def main(argv: list[str] | None = None) -> int:
    """Entry point for torchrun: `torchrun --nproc-per-node N -m training.hidden_states ...`."""
    p = argparse.ArgumentParser(prog="python -m training.hidden_states", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="target model directory (config, weights, tokenizer)")
    p.add_argument("--data", required=True, help="generation output directory (shard-*.jsonl)")
    p.add_argument("--out", required=True, help="store directory (created; resumed when it exists)")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="aux layer ids: inputs of these decoder layers (default [2, N//2, N-3])")
    p.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--no-final", action="store_true", help="do not store the final normed state")
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--batch-tokens", type=int, default=16384)
    args = p.parse_args(argv)
    try:
        stats = run(
            args.model,
            args.data,
            args.out,
            layer_ids=args.layers,
            dtype=args.dtype,
            has_final=not args.no_final,
            max_len=args.max_len,
            batch_tokens=args.batch_tokens,
        )
    except TrainingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({**asdict(stats), "tokens_per_s": round(stats.tokens_per_s, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
