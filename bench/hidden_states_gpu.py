"""Hidden-state extraction throughput on one GPU: an 8B-shaped random-init Llama writing shards to local disk.

Measures, in one run: the bf16 matmul peak of this GPU; extraction tokens/s through the toolkit's
own capture (`capture_batch`) and store (`StoreWriter` on a background thread), per store dtype;
the fraction of the peak that reaches (forward FLOPs = 2 x params x tokens); bytes/token stored.
Prints one JSON line. Needs only torch, transformers, safetensors and numpy.

    python bench/hidden_states_gpu.py                       # 8B shape, seq 2048, ~5 minutes on an H200
    python bench/hidden_states_gpu.py --layers 4 --samples 16 --seq 512   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peak import matmul_peak_tflops, sync as _sync  # noqa: E402

from training.capture.forward import capture_batch, sample_finite  # noqa: E402
from training.capture.host import BackgroundWriter, HostCopier  # noqa: E402
from training.target.layers import default_aux_layers  # noqa: E402
from training.storage.format import HiddenStateSample, StoreMeta, bytes_per_token  # noqa: E402
from training.storage.writer import StoreWriter  # noqa: E402


def disk_write_gbps(out_dir: Path, total_bytes: int, threads: int = 3, chunk: int = 64 * 1024**2) -> float:
    """Return the disk's write speed (GB/s) as the store uses it: `threads` files written in
    parallel, each fsynced, from incompressible bytes. The ceiling the store's writes compare to."""
    from concurrent.futures import ThreadPoolExecutor

    out_dir.mkdir(parents=True, exist_ok=True)
    chunk = min(chunk, max(1, total_bytes // threads))
    data = memoryview(os.urandom(chunk))
    per_thread = max(1, total_bytes // threads // chunk)

    def one(i: int) -> None:
        with open(out_dir / f".disk-probe-{i}", "wb") as f:
            for _ in range(per_thread):
                f.write(data)
            f.flush()
            os.fsync(f.fileno())

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
    seconds = time.perf_counter() - start
    for i in range(threads):
        (out_dir / f".disk-probe-{i}").unlink()
    return threads * per_thread * chunk / seconds / 1e9


def build_model(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
                seq: int, device: torch.device) -> Any:
    """Return a random-init Llama of the given shape (bf16 + sdpa on GPU), in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=max(seq, 128),
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def run_bench(
    *,
    hidden: int = 4096,
    layers: int = 32,
    heads: int = 32,
    kv_heads: int = 8,
    intermediate: int | None = None,
    vocab: int = 128256,
    seq: int = 2048,
    samples: int = 128,
    batch: int = 8,
    dtypes: tuple[str, ...] = ("bf16", "fp8"),
    out_dir: str | Path = "/tmp/curator-bench-hidden-states",
    device: str = "cuda",
    peak_size: int = 8192,
    warmup: int = 2,
    keep: bool = False,
    flush_workers: int = 3,
    disk_probe_bytes: int = 4 * 1024**3,
) -> dict[str, Any]:
    """Return the benchmark's results (tokens/s per dtype, fraction of peak, bytes/token, ...)."""
    dev = torch.device(device)
    disk = disk_write_gbps(Path(out_dir), disk_probe_bytes, threads=max(1, flush_workers))
    peak = matmul_peak_tflops(dev, peak_size)
    model = build_model(hidden, layers, heads, kv_heads, intermediate or int(hidden * 3.5), vocab, seq, dev)
    all_params = sum(p.numel() for p in model.parameters())
    # What the capture runs: the decoder layers and final norm (no embedding matmul, no lm_head).
    run_params = sum(p.numel() for n, p in model.model.named_parameters() if not n.startswith("embed_tokens"))
    aux_ids = default_aux_layers(layers)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (samples, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long, device=dev)
    out = Path(out_dir)
    for _ in range(warmup):
        capture_batch(model, ids[:batch].to(dev), mask, aux_ids)
    _sync(dev)

    per_dtype: dict[str, Any] = {}
    for dtype in dtypes:
        store = out / dtype
        shutil.rmtree(store, ignore_errors=True)
        meta = StoreMeta(target="random-llama", hidden_size=hidden, num_layers=layers, vocab_size=vocab,
                         aux_layer_ids=aux_ids, dtype=dtype, has_final=True)
        forward_s = copy_s = put_s = 0.0
        copier = HostCopier()
        start = time.perf_counter()
        with StoreWriter(store, meta, writer_id="bench", flush_workers=flush_workers) as writer:
            bg = BackgroundWriter(writer)
            for lo in range(0, samples, batch):
                chunk = ids[lo : lo + batch]
                f0 = time.perf_counter()
                states = capture_batch(model, chunk.to(dev, non_blocking=True), mask[: len(chunk)], aux_ids)
                finite = sample_finite(states, [seq] * len(chunk))  # waits for the forward
                f1 = time.perf_counter()
                host = copier(states, meta)  # fp8: quantised on the GPU; the copy runs on a side stream
                f2 = time.perf_counter()
                bg.put([
                    HiddenStateSample(f"s{lo + b}", chunk[b], torch.ones(seq, dtype=torch.bool), finite=finite[b],
                                      **host.rows(b, seq))
                    for b in range(len(chunk))
                ], host)
                f3 = time.perf_counter()
                forward_s, copy_s, put_s = forward_s + f1 - f0, copy_s + f2 - f1, put_s + f3 - f2
            drain0 = time.perf_counter()
            bg.close()
            wall = time.perf_counter() - start
            drain_s = wall - (drain0 - start)
            stored, written = writer.stored, writer.bytes_written
        tokens = stored * seq
        per_dtype[dtype] = {
            "tokens_per_s": tokens / wall,
            "forward_only_tokens_per_s": tokens / forward_s,
            "bytes_per_token_on_disk": written / max(tokens, 1),
            "write_gb_per_s": written / wall / 1e9,
            "fraction_of_disk": written / wall / 1e9 / disk,
            "wall_s": wall,
            # where the capture loop's time went: the forward (GPU), queueing the copy, waiting for
            # room in the writer's queue (back-pressure from the disk), and the final drain
            "loop_s": {"forward": forward_s, "queue_copy": copy_s, "writer_backpressure": put_s, "drain": drain_s},
            "stored_samples": stored,
        }
        if not keep:
            shutil.rmtree(store, ignore_errors=True)

    first = per_dtype[dtypes[0]]
    achieved = 2 * run_params * first["tokens_per_s"] / 1e12
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": {"hidden": hidden, "layers": layers, "vocab": vocab, "seq": seq, "batch": batch},
        "params": all_params,
        "params_run": run_params,
        "aux_layer_ids": aux_ids,
        "peak_tflops": peak,
        "disk_write_gb_per_s": disk,
        "tokens": first["stored_samples"] * seq,
        "tokens_per_s": first["tokens_per_s"],
        "achieved_tflops": achieved,
        # FLOPs = 2 x params x tokens over the parameters the forward multiplies with (decoder + norm)
        "fraction_of_peak": achieved / peak,
        "fraction_of_peak_all_params": 2 * all_params * first["tokens_per_s"] / 1e12 / peak,
        "forward_only_fraction_of_peak": 2 * run_params * first["forward_only_tokens_per_s"] / 1e12 / peak,
        "bytes_per_token": {d: bytes_per_token(hidden, len(aux_ids), d, True) for d in ("bf16", "fp8")},
        "stored_samples": first["stored_samples"],
        "per_dtype": per_dtype,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtypes", default="bf16,fp8")
    p.add_argument("--out", default="/tmp/curator-bench-hidden-states", help="local disk for the shards")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--keep", action="store_true", help="keep the written stores")
    p.add_argument("--flush-workers", type=int, default=3, help="threads serialising and writing shards")
    p.add_argument("--disk-probe-gb", type=float, default=4.0, help="bytes written to measure the disk's own speed")
    a = p.parse_args(argv)
    result = run_bench(hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads, intermediate=a.intermediate,
                       vocab=a.vocab, seq=a.seq, samples=a.samples, batch=a.batch,
                       dtypes=tuple(d for d in a.dtypes.split(",") if d), out_dir=a.out, device=a.device, keep=a.keep,
                       peak_size=8192 if a.device != "cpu" else 512, flush_workers=a.flush_workers,
                       disk_probe_bytes=int(a.disk_probe_gb * 1024**3))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
