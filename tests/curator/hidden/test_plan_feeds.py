"""`curator plan --epochs --cache-budget --capture-rate`: a full store priced against engine-fed training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curator.cli import main

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}}


def test_kimi_100k_priced_three_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "kimi.json"
    cfg.write_text(json.dumps(KIMI))
    assert main(["plan", "--model", str(cfg), "--samples", "100000", "--avg-tokens", "2103", "--epochs", "3",
                 "--cache-budget", "500GB", "--capture-rate", "47000", "--json"]) == 0
    feeds = {f["name"].split(",")[0] + ("" if "cache" not in f["name"] else " cache"): f
             for f in json.loads(capsys.readouterr().out)["feeds"]}
    store, every, cached = feeds["full store"], feeds["engine-fed"], feeds["engine-fed cache"]
    assert round(store["disk_high_water"] / 1e12, 1) == 12.1 and store["prefill_per_epoch"] == [210_300_000, 0, 0]
    assert every["prefill_total"] == 3 * 210_300_000 and every["disk_high_water"] < 10**10
    assert cached["disk_high_water"] < 510 * 10**9 and cached["prefill_per_epoch"][1] < 210_300_000
    assert every["capture_s"] == pytest.approx(3 * 210_300_000 / 47000)


def test_a_bad_budget_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "kimi.json"
    cfg.write_text(json.dumps(KIMI))
    assert main(["plan", "--model", str(cfg), "--samples", "10", "--avg-tokens", "5", "--cache-budget", "lots"]) == 1
    assert "lots" in capsys.readouterr().err
