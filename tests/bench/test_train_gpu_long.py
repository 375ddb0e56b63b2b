"""bench/train_gpu.py's long-context and fused-path options run at toy sizes on the CPU.

The H200 figures come from the same code (bench/RESULTS.md); here: every requested length and
recompute mode gives a finite loss, the kept and recomputed steps train to the same loss (same
weights, same batch, same arithmetic), and an unknown path is refused by name.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest


def _bench():
    spec = importlib.util.spec_from_file_location("train_gpu", Path(__file__).parents[2] / "bench" / "train_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_long_context_runs_each_length_with_and_without_recompute(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    assert bench.main(["--tiny", "--path", "compiled,fused", "--steps", "1", "--warmup", "0", "--long", "40,96",
                       "--long-recompute", "off,on,2", "--long-steps", "1", "--long-warmup", "0"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    runs = result["long"]
    assert sorted(runs) == sorted(f"fused@{n}/recompute={m}" for n in (40, 96) for m in ("off", "on", "2"))
    for name, r in runs.items():
        assert "error" not in r, name
        assert r["useful_tokens_per_s"] > 0 and math.isfinite(r["last_loss"]) and r["auto_recomputed_steps"] == 0
    for n in (40, 96):  # the first step's loss, before any update: recomputation changes no value
        off = runs[f"fused@{n}/recompute=off"]
        assert off["recomputed_steps"] == 0 and runs[f"fused@{n}/recompute=on"]["recomputed_steps"] == 2  # TTT 3
        for mode in ("on", "2"):
            assert runs[f"fused@{n}/recompute={mode}"]["last_loss"] == pytest.approx(off["last_loss"], rel=1e-6)
    assert set(result["paths"]) == {"compiled", "fused"}


def test_causal_flop_count_is_the_benchmarks_at_short_rows_and_half_its_attention_at_long_ones() -> None:
    bench = _bench()
    cfg = bench.KIMI.config(65536)
    short = bench.causal_train_flops_per_token(cfg, 7, 2048) / bench.train_flops_per_token(cfg, 7, 2048)
    assert 0.97 < short < 1.0
    layer, fc, attn = bench.layer_flops(cfg)
    gap = bench.train_flops_per_token(cfg, 7, 65536) - bench.causal_train_flops_per_token(cfg, 7, 65536)
    assert gap == pytest.approx(3 * 6 * attn * 65536 / 2)  # steps 1..6 counted over the full matrix before


def test_an_unknown_path_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown path"):
        _bench().run_bench(shape=_bench().TINY, path="compiled,turbo", device="cpu", peak_n=64, peak_iters=1)
