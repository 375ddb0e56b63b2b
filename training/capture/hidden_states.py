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
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from training.capture.forward import capture_batch, load_target, pad_batch, sample_finite
from training.capture.host import BackgroundWriter, HostCopier
from training.capture.prepare import length_batches, max_positions, prepare_samples, sample_windows, store_meta
from training.capture.ranks import claim_for_ranks, finish_ranks
from training.capture.stats import ExtractStats
from training.errors import ModelMismatchError, TrainingError
from training.records.chat_tokens import (
    GenerationReadStats,
    iter_generation,
)
from training.runtime.distributed import init_distributed
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.writer import StoreWriter


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
                vocab_size=meta.vocab_size, positions=max_positions(model.config),
            )
            for chunk in sample_windows(samples, window):
                for batch in length_batches([len(s.input_ids) for s in chunk], batch_tokens):
                    items = [chunk[i] for i in batch]
                    ids, mask = pad_batch([s.input_ids for s in items], tokenizer.pad_token_id or 0)
                    states = capture_batch(model, ids.to(device), mask.to(device), meta.aux_layer_ids, meta.has_final,
                                           with_prenorm=meta.has_final_prenorm)
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
                                                     category=s.category, mode=s.mode, finite=finite[b],
                                                     **host.rows(b, t)))  # type: ignore[arg-type]
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


def run(
    model_path: str | Path,
    gen_dir: str | Path,
    out_dir: str | Path,
    *,
    layer_ids: list[int] | None = None,
    dtype: str = "bf16",
    has_final: bool = True,
    final_prenorm: bool = False,
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
            has_final_prenorm=final_prenorm,
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
    p.add_argument("--final-prenorm", action="store_true",
                   help="also store the final state before the final norm (what speculators trains on)")
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
            final_prenorm=args.final_prenorm,
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
