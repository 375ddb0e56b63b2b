"""`curator export-data` against a plain copy of the same bytes, measured in the same run.

A bf16 store of N records x T tokens (aux layers, final state after and before the norm) is written
with the store's own writer, then each layout is exported from it and timed (every file fsynced, the
folder published whole), and the same bytes are copied plainly (`shutil.copyfile` of every file of the
export, each fsynced) as the floor a disk gives. Both read what was just written (the page cache), so
the ratio is what the export adds on top of writing the bytes: reading the store, shaping tensors,
torch.save / safetensors framing, one file per row.

    PYTHONPATH=. python bench/export_data_bench.py                         # 2,000 x 2,048 tokens, hidden 64, median of 3
    PYTHONPATH=. python bench/export_data_bench.py --records 100000 --tokens 2048 --hidden 8 --dir /mnt/big
    PYTHONPATH=. python bench/export_data_bench.py --json bench/results/export_data.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from curator.handoff.export import export_data  # noqa: E402
from training.storage.format import HiddenStateSample, StoreMeta  # noqa: E402
from training.storage.writer import StoreWriter  # noqa: E402

LAYOUTS = ("speculators", "specforge-offline", "modelopt")
N_AUX = 3


def make_store(root: Path, records: int, tokens: int, hidden: int, vocab: int = 32000) -> Path:
    """Write a store of `records` samples of `tokens` tokens (random states) with the store's writer."""
    meta = StoreMeta(target="bench", hidden_size=hidden, num_layers=32, vocab_size=vocab, aux_layer_ids=[2, 16, 29],
                     has_final_prenorm=True)
    g = torch.Generator().manual_seed(0)
    # one block of random states reused by every sample: the bench measures bytes moved, not their values
    aux = torch.randn(tokens, N_AUX * hidden, generator=g).to(torch.bfloat16)
    final = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (tokens,), generator=g)
    mask = torch.arange(tokens) >= tokens // 2
    with StoreWriter(root, meta) as writer:
        for i in range(records):
            writer.add(HiddenStateSample(id=f"s{i:07d}", input_ids=ids, loss_mask=mask, aux=aux, final=final,
                                         final_prenorm=final, finite=True))
    return root


def copy_tree(src: Path, dst: Path) -> int:
    """Copy every file of `src` to `dst` with fsync each; return the bytes copied."""
    total = 0
    for path in sorted(src.rglob("*")):
        if path.is_file():
            to = dst / path.relative_to(src)
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, to)
            fd = os.open(to, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            total += path.stat().st_size
    return total


def run(records: int, tokens: int, hidden: int, scratch: Path, layouts: tuple[str, ...] = LAYOUTS,
        repeat: int = 1) -> dict[str, Any]:
    """Return, per layout, the median of `repeat` exports and of as many plain copies of its files (alternated)."""
    store = make_store(scratch / "store", records, tokens, hidden)
    out: dict[str, Any] = {"records": records, "tokens_per_record": tokens, "hidden": hidden, "repeat": repeat,
                           "store_bytes": sum(p.stat().st_size for p in (store / "shards").iterdir()), "layouts": {}}
    for layout in layouts:
        dest, copy = scratch / f"export-{layout}", scratch / f"copy-{layout}"
        exports, copies = [], []
        for _ in range(repeat):
            shutil.rmtree(dest, ignore_errors=True)
            shutil.rmtree(copy, ignore_errors=True)
            os.sync()  # the writeback of what came before is not this phase's
            t0 = time.perf_counter()
            report = export_data(layout, dest, store=store)
            exports.append(time.perf_counter() - t0)
            os.sync()
            t0 = time.perf_counter()
            copied = copy_tree(dest, copy)
            copies.append(time.perf_counter() - t0)
        export_s, copy_s = statistics.median(exports), statistics.median(copies)
        out["layouts"][layout] = {
            "files": report.files, "bytes": copied, "export_s": round(export_s, 3), "copy_s": round(copy_s, 3),
            "export_MB_per_s": round(copied / export_s / 1e6, 1), "copy_MB_per_s": round(copied / copy_s / 1e6, 1),
            "export_over_copy": round(export_s / copy_s, 3),
            "export_runs_s": [round(x, 3) for x in exports], "copy_runs_s": [round(x, 3) for x in copies]}
        shutil.rmtree(dest)
        shutil.rmtree(copy)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--repeat", type=int, default=3, help="median of this many exports and copies, alternated (a VM disk is noisy)")
    p.add_argument("--dir", type=Path, default=None, help="scratch folder on the disk to measure (default: a temp folder)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = run(args.records, args.tokens, args.hidden, Path(tmp), tuple(args.layouts.split(",")), args.repeat)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
