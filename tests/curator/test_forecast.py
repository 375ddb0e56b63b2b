"""`curator forecast`: the law fitted, the samples for a goal with a band, the refusals, the cost,
the break-even, and the nested subsets the drafts are trained on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from curator import forecast as fc
from curator.cli import main
from curator.errors import ConfigError
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.reader import HiddenStateStore
from training.storage.writer import StoreWriter


def loglinear(ns, a=1.2, b=0.15, wiggle=(0.004, -0.006, 0.005, -0.003)):
    return [fc.Point(n, a + b * math.log(n) + w) for n, w in zip(ns, wiggle)]


def saturating(ns, a=-4.0, b=0.5, steps=4, wiggle=(0.003, -0.004, 0.004, -0.002, 0.001)):
    return [fc.Point(n, 1 + steps / (1 + math.exp(-(a + b * math.log(n)))) + w) for n, w in zip(ns, wiggle)]


def test_log_linear_points_forecast_the_samples_for_the_goal_inside_the_band() -> None:
    pts = loglinear([250, 500, 1000, 2000])
    truth = math.exp((3.0 - 1.2) / 0.15)  # ~163K
    out = fc.forecast_category("code", pts, goal=3.0, steps=7)
    assert out.verdict == "forecast" and out.law == "log-linear"
    assert out.needed == pytest.approx(truth, rel=0.25)
    lo, hi = out.band
    assert lo < out.needed < hi and lo < truth < hi


def test_saturating_points_pick_the_saturating_law_by_residual() -> None:
    pts = saturating([100, 400, 1600, 3200])
    out = fc.forecast_category("code", pts, goal=3.5, steps=4)
    assert out.law == "saturating" and out.fits["saturating"].rmse < out.fits["log-linear"].rmse
    truth = math.exp((math.log(2.5 / 1.5) + 4.0) / 0.5)
    assert out.needed == pytest.approx(truth, rel=0.2)
    # the fitted saturating curve never passes the chain's ceiling K + 1
    assert out.fits["saturating"].predict(1e12) <= 5.0


def test_too_few_runs_give_no_number() -> None:
    out = fc.forecast_category("chat", loglinear([500, 1000]), goal=3.0, steps=7)
    assert out.verdict == "too few runs" and out.needed is None and out.band is None


def test_flat_curve_is_called_flat_instead_of_extrapolated() -> None:
    pts = [fc.Point(n, 1.8 + w) for n, w in zip([250, 500, 1000, 2000], (0.01, -0.012, 0.013, -0.009))]
    out = fc.forecast_category("chat", pts, goal=3.0, steps=7)
    assert out.verdict == "flat" and out.needed is None and "not the lever" in out.reason


def test_a_goal_hundreds_of_times_past_the_largest_run_gets_no_number() -> None:
    # 1.40 -> 1.54 over 250-2,000 samples: 3.0 lies ~1e11 samples out on that line
    pts = [fc.Point(n, 1.26 + 0.068 * math.log(n / 137) + w) for n, w in zip([137, 273, 546, 1093], (0.004, -0.003, 0.002, 0))]
    out = fc.forecast_category("code", pts, goal=3.0, steps=4)
    assert out.verdict == "beyond the data" and out.needed is None and out.band is None
    assert "more of this data alone" in out.reason


def test_goal_past_the_chain_ceiling_or_already_reached() -> None:
    assert fc.forecast_category("a", loglinear([250, 500, 1000]), goal=5.0, steps=4).verdict == "unreachable"
    reached = fc.forecast_category("a", loglinear([250, 500, 1000]), goal=2.2, steps=4)
    assert reached.verdict == "reached" and reached.needed == 1000


def test_measurement_noise_widens_a_band_that_three_collinear_points_would_shrink() -> None:
    exact = [fc.Point(n, 1.2 + 0.15 * math.log(n)) for n in (250, 1000, 4000)]
    noisy = [fc.Point(p.samples, p.acceptance, se=0.05) for p in exact]
    a = fc.forecast_category("x", exact, 3.0, 7)
    b = fc.forecast_category("x", noisy, 3.0, 7)
    assert a.needed == pytest.approx(b.needed)
    assert (b.band[1] - b.band[0]) > 10 * (a.band[1] - a.band[0])


def test_break_even_from_a_bench_serve_report_is_acceptance_over_speedup(tmp_path: Path) -> None:
    # the original case: acceptance 2.1 served at 82.3 tok/s against 90 without the draft
    report = tmp_path / "serve.json"
    report.write_text(json.dumps({"concurrency": {
        "1": {"acceptance_length": 2.1, "speedup": 82.3 / 90, "draft_tokens_per_s": 82.3, "baseline_tokens_per_s": 90},
        "8": {"acceptance_length": None, "speedup": 1.1}}}))
    (be,) = fc.break_even_from_report(report)
    assert be.acceptance == pytest.approx(2.1 * 90 / 82.3) and "concurrency 1" in be.source
    bad = tmp_path / "nobaseline.json"
    bad.write_text(json.dumps({"concurrency": {"1": {"acceptance_length": 2.1, "speedup": None}}}))
    with pytest.raises(ConfigError, match="--baseline"):
        fc.break_even_from_report(bad)


def test_nested_subsets_are_nested_and_keep_the_category_shares() -> None:
    ids = {"code": [f"c{i}" for i in range(800)], "chat": [f"h{i}" for i in range(200)]}
    subsets = fc.nested_subsets(ids, [0.125, 0.5, 0.25], seed=3)
    sizes = [0.125, 0.25, 0.5]
    assert list(subsets) == sizes
    for small, big in zip(sizes, sizes[1:]):
        assert set(subsets[small]) < set(subsets[big])
    for f, chosen in subsets.items():
        assert sum(s.startswith("c") for s in chosen) == round(800 * f) and sum(s.startswith("h") for s in chosen) == round(200 * f)
    # not the first ids in sorted order (the trainer's max_train_samples would take those: one source's rows)
    assert subsets[0.125] != sorted(ids["code"])[:100] + sorted(ids["chat"])[:25]
    with pytest.raises(ConfigError):
        fc.nested_subsets(ids, [0.0, 0.5])


def _store(root: Path, n: int) -> Path:
    meta = StoreMeta(target="tiny", hidden_size=8, num_layers=4, vocab_size=50, aux_layer_ids=[1, 2, 3])
    with StoreWriter(root, meta) as w:
        for i in range(n):
            g = torch.Generator().manual_seed(i)
            w.add(HiddenStateSample(id=f"s{i:03d}", input_ids=torch.randint(0, 50, (5,), generator=g),
                                    loss_mask=torch.ones(5, dtype=torch.bool), aux=torch.randn(5, 24).to(torch.bfloat16),
                                    final=torch.randn(5, 8).to(torch.bfloat16), category="code" if i % 3 else "chat"))
    return root


def test_subset_store_reads_only_its_ids_and_leaves_the_pool_untouched(tmp_path: Path) -> None:
    pool = _store(tmp_path / "pool", 30)
    before = sorted(p.name for p in (pool / "shards").iterdir())
    view = fc.subset_store(pool, ["s001", "s004", "s009"], tmp_path / "view")
    store = HiddenStateStore.open(view)
    assert store.ids() == ["s001", "s004", "s009"]
    assert torch.equal(store["s004"].input_ids, HiddenStateStore.open(pool)["s004"].input_ids)
    assert sorted(p.name for p in (pool / "shards").iterdir()) == before and len(HiddenStateStore.open(pool)) == 30
    with pytest.raises(ConfigError, match="not in the store"):
        fc.subset_store(pool, ["nope"], tmp_path / "view2")


def test_costs_price_the_needed_samples_from_generation_stats(tmp_path: Path) -> None:
    gen = fc.GenerationCost({"code": 2000.0}, {"code": 1500.0}, output_tokens_per_s=5000.0, gpus=8)
    pts = loglinear([250, 500, 1000, 2000])
    result = fc.make_forecast({"code": pts}, 3.0, 7, generation=gen, bytes_per_token=4 * 7168 * 2 + 5)
    (cat,) = result.categories
    cost = result.costs["code"]
    assert cost.target_tokens == pytest.approx(cat.needed * 2000)
    assert cost.gpu_hours == pytest.approx(cat.needed * 1500 / 5000 / 3600 * 8)
    assert cost.disk_bytes == pytest.approx(cat.needed * 2000 * (4 * 7168 * 2 + 5))
    lo, hi = result.cost_bands["code"]
    assert lo.samples < cost.samples < hi.samples


def test_cli_refuses_without_runs_and_says_what_to_give(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forecast", "--goal", "3.0"]) == 1
    assert "--run RUN_DIR" in capsys.readouterr().err.replace("\n", " ")


def test_forecast_trains_nested_drafts_from_a_store_then_reads_the_same_runs_back(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.training.train.test_trainer import make_store

    store = make_store(tiny_target, tmp_path / "store", n=40)
    entries = json.loads((store / "index.json").read_text())["samples"] if (store / "index.json").exists() else None
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"draft_vocab_size": 512, "ttt_steps": 3, "global_batch_size": 2, "micro_batch_size": 2,
                               "max_steps": 2, "log_every": 1, "device": "cpu"}))
    out_json = tmp_path / "forecast.json"
    assert main(["forecast", "--store", str(store), "--target", str(tiny_target), "--fractions", "0.25,0.5,1",
                 "--config", str(cfg), "--out", str(tmp_path / "runs"), "--goal", "3.0", "--verify-cost", "2.3",
                 "--json", str(out_json)]) == 0
    trained = json.loads(out_json.read_text())
    (cat,) = trained["categories"]
    sizes = [p["samples"] for p in cat["points"]]
    assert cat["category"] == "chat" and len(sizes) == 3 and sizes[0] < sizes[1] < sizes[2]
    assert trained["break_even"] == [{"acceptance": 2.3, "source": "--verify-cost"}]
    shown = capsys.readouterr().out
    assert "break-even acceptance 2.30" in shown and "chat:" in shown
    # the pool itself is never written to: the subsets are views
    assert entries is None or json.loads((store / "index.json").read_text())["samples"] == entries
    runs = sorted((tmp_path / "runs").glob("run-*"))
    assert main(["forecast", *[a for r in runs for a in ("--run", str(r))], "--goal", "3.0", "--json", str(out_json)]) == 0
    again = json.loads(out_json.read_text())["categories"][0]
    assert sorted((p["samples"], p["acceptance"]) for p in again["points"]) == sorted(
        (p["samples"], p["acceptance"]) for p in cat["points"])


def test_a_run_is_credited_with_the_ids_the_trainer_took_in_the_store_s_order() -> None:
    # capture order is not sorted order: max_train_samples cuts the store's own order, as the trainer does
    from training.feed.batches import split_eval, training_ids

    store_ids = [f"s{i:03d}" for i in range(200)][::-1]
    train, held = training_ids(store_ids, separate_eval=False, eval_fraction=0.1, eval_max_samples=None,
                               max_train_samples=50)
    kept, split = split_eval(store_ids, 0.1)
    assert train == kept[:50] and held == split and train != sorted(kept)[:50]
    train, held = training_ids(store_ids, separate_eval=True, eval_fraction=0.1, eval_max_samples=None,
                               max_train_samples=None)
    assert train == sorted(store_ids) and held == []


def test_subset_store_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    """issue 38 item 4: forecast's subset views and runs are folders of their own inside --out."""
    from training.io.atomic import OutputPathError

    pool = _store(tmp_path / "pool", 10)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "subset-0.125").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputPathError, match="is a link"):
        fc.subset_store(pool, ["s001"], tmp_path / "runs" / "subset-0.125")
    assert list(elsewhere.iterdir()) == []


# ---- the training budget (issue 39 item 2) ----------------------------------------------------


def test_effective_samples_run_from_samples_alone_to_sequences_alone() -> None:
    # Muennighoff et al.: one epoch is the samples themselves; R* -> 0 counts no repeat, R* -> inf every one
    assert float(fc.effective_samples(1000, 1.0, 15.4)) == pytest.approx(1000)
    assert float(fc.effective_samples(1000, 0.5, 15.4)) == pytest.approx(500)
    assert float(fc.effective_samples(1000, 10.0, 1e-9)) == pytest.approx(1000)
    assert float(fc.effective_samples(1000, 10.0, 1e12)) == pytest.approx(10_000)
    mid = float(fc.effective_samples(1000, 10.0, 15.4))
    assert 1000 < mid < 10_000 and float(fc.effective_samples(1000, None, 15.4)) == 1000


def budget_points(r_star: float, sequences: float, sizes=(250, 500, 1000, 2000), a=-3.0, b=0.3, steps=4):
    """Points of a saturating law in effective data, each size trained `sequences` sequences."""
    out = []
    for n, w in zip(sizes, (0.003, -0.004, 0.004, -0.002)):
        e = sequences / n
        d = float(fc.effective_samples(n, e, r_star))
        out.append(fc.Point(n, 1 + steps / (1 + math.exp(-(a + b * math.log(d)))) + w, epochs=e))
    return out


def test_a_fixed_step_budget_is_seen_and_the_large_draft_predicted_inside_the_band() -> None:
    pts = budget_points(10.0, 19_200)
    truth = budget_points(10.0, 19_200, sizes=(8000,), steps=4)[0]
    ens = fc.fit_ensemble(pts, 4)
    pred = ens.predict(8000, 19_200 / 8000)
    lo, hi = np.percentile(ens.predict_draws(8000, 0, 19_200 / 8000), fc.BAND)
    assert abs(pred / truth.acceptance - 1) < 0.02 and lo <= truth.acceptance <= hi
    # on samples alone the same points overshoot, and the line's band misses
    _, old = fc.best_fit([fc.Point(p.samples, p.acceptance) for p in pts], 4)
    olo, ohi = np.percentile(old.predict_draws(8000), fc.BAND)
    assert old.predict(8000) > truth.acceptance * 1.03 and not olo <= truth.acceptance <= ohi


def test_the_samples_for_a_goal_depend_on_the_budget_they_will_train_at() -> None:
    pts = budget_points(10.0, 19_200)
    at_steps = fc.forecast_category("code", pts, 3.2, 4, budget=fc.Budget(sequences=200_000))
    at_epochs = fc.forecast_category("code", pts, 3.2, 4, budget=fc.Budget(epochs=1.0))
    assert at_steps.verdict == at_epochs.verdict == "forecast"
    # one epoch sees each sample once: it needs more samples than 200,000 sequences of repeats would
    assert at_epochs.needed > 2 * at_steps.needed
    lo, hi = at_steps.band
    assert lo <= at_steps.needed <= hi <= 200_000
    # a goal that even 19,200 new samples miss needs more steps, not more data
    far = fc.forecast_category("code", pts, 4.0, 4, budget=fc.Budget(sequences=19_200))
    assert far.verdict == "unreachable" and "more training steps" in far.reason


def test_runs_with_and_without_a_recorded_budget_are_not_mixed() -> None:
    pts = budget_points(10.0, 19_200)
    pts[0] = fc.Point(pts[0].samples, pts[0].acceptance)
    with pytest.raises(ConfigError, match="some runs record"):
        fc.make_forecast({"code": pts}, 3.0, 4)


# ---- impossible inputs, and a forecast stopped midway (issue 38 item 8) -------------------------


@pytest.fixture(scope="module")
def forecast_runs(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One whole `curator forecast --store` of three subsets (saving every step), its runs and JSON."""
    from tests.training.train.test_trainer import make_store

    root = tmp_path_factory.mktemp("forecast")
    store = make_store(tiny_target, root / "store", n=40)
    cfg = root / "train.json"
    cfg.write_text(json.dumps({"draft_vocab_size": 512, "ttt_steps": 3, "global_batch_size": 2, "micro_batch_size": 2,
                               "max_steps": 2, "log_every": 1, "save_every": 1, "device": "cpu"}))
    args = ["forecast", "--store", str(store), "--target", str(tiny_target), "--fractions", "0.25,0.5,1",
            "--config", str(cfg), "--goal", "3.0"]
    assert main([*args, "--out", str(root / "runs"), "--json", str(root / "whole.json")]) == 0
    return {"root": root, "store": store, "config": cfg, "runs": root / "runs", "json": root / "whole.json",
            "args": args}  # type: ignore[dict-item]


def _points_of(path: Path) -> list[tuple[int, float, float]]:
    cat = json.loads(path.read_text())["categories"][0]
    return sorted((p["samples"], p["acceptance"], p["epochs"]) for p in cat["points"])


def test_a_subset_draft_records_its_steps_and_epochs(forecast_runs: dict[str, Path]) -> None:
    points = _points_of(forecast_runs["json"])
    assert [e for *_, e in points] == pytest.approx([2 * 2 / n for n, *_ in points])  # 2 steps of 2 sequences
    assert json.loads(forecast_runs["json"].read_text())["budget"] == {"epochs": None, "sequences": 4.0}
    runs = sorted(forecast_runs["runs"].glob("run-*"))
    got = fc.run_point(runs[0])
    assert got.train_steps == 2 and got.batch_size == 2 and got.epochs == pytest.approx(4 / sum(got.counts.values()))
    # read back as runs: the same budget (their common max_steps x batch), or the one given
    out = forecast_runs["root"] / "again.json"
    for extra, budget in (([], {"epochs": None, "sequences": 4.0}), (["--epochs", "3"], {"epochs": 3.0, "sequences": None}),
                          (["--max-steps", "10"], {"epochs": None, "sequences": 20.0})):
        assert main(["forecast", *[a for r in runs for a in ("--run", str(r))], *extra, "--json", str(out)]) == 0
        assert json.loads(out.read_text())["budget"] == budget and _points_of(out) == points


def test_a_forecast_killed_midway_resumes_reusing_finished_runs(
    forecast_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import training.train.trainer as trainer

    real = trainer.train
    calls: list[str] = []

    def killed_in_the_third(cfg, **kw):  # type: ignore[no-untyped-def]
        calls.append(Path(cfg.out).name)
        if len(calls) == 3:
            real(cfg, stop_after_steps=1, **kw)  # step 1 saved, then the process dies
            raise KeyboardInterrupt
        return real(cfg, **kw)

    out = tmp_path / "runs"
    args = [*forecast_runs["args"], "--out", str(out), "--json", str(tmp_path / "f.json")]
    monkeypatch.setattr(trainer, "train", killed_in_the_third)
    assert main(args) == 130  # the CLI's Ctrl-C
    monkeypatch.setattr(trainer, "train", real)
    assert (out / "run-0.5" / "summary.json").exists() and not (out / "run-1" / "summary.json").exists()
    capsys.readouterr()
    assert main(args) == 1
    assert "pass --resume" in capsys.readouterr().err
    finished = {r: (out / r / "metrics.jsonl").read_bytes() for r in ("run-0.25", "run-0.5")}
    assert main([*args, "--resume"]) == 0
    shown = capsys.readouterr()
    assert shown.err.count("finished before, read back") + shown.out.count("finished before, read back") == 2
    assert {r: (out / r / "metrics.jsonl").read_bytes() for r in finished} == finished  # not trained again
    # the resumed run continues exactly: the same figures and weights as the forecast never stopped
    assert _points_of(tmp_path / "f.json") == _points_of(forecast_runs["json"])
    from safetensors.torch import load_file
    from training.train.checkpoint import latest_checkpoint

    a, b = (load_file(str(latest_checkpoint(d / "run-1") / "draft.safetensors")) for d in (forecast_runs["runs"], out))
    assert a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=1e-6) for k in a)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 1e308, "2.5", None])
def test_an_impossible_acceptance_in_a_run_is_a_named_error(
    forecast_runs: dict[str, Path], tmp_path: Path, value: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sorted(forecast_runs["runs"].glob("run-*"))[0], run, symlinks=True)
    summary = json.loads((run / "summary.json").read_text())
    summary["eval"]["sim_categories"]["chat"] = value
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["forecast", "--run", str(run), "--goal", "3.0"]) == 1
    err = capsys.readouterr().err.replace("\n", " ")
    assert "category chat" in err and "acceptance" in err and "unexpected" not in err
    assert ("impossible" if isinstance(value, float) else "not a number") in err


def test_one_bad_run_among_several_is_counted_and_skipped(
    forecast_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    runs = sorted(forecast_runs["runs"].glob("run-*"))
    bad = tmp_path / "bad"
    shutil.copytree(runs[0], bad, symlinks=True)
    summary = json.loads((bad / "summary.json").read_text())
    summary["eval"]["sim_categories"]["chat"] = float("nan")
    (bad / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "f.json"
    assert main(["forecast", *[a for r in [*runs, bad] for a in ("--run", str(r))], "--goal", "3.0",
                 "--json", str(out)]) == 0
    assert "skipped 1 of 4 runs" in capsys.readouterr().err.replace("\n", " ")
    assert len(_points_of(out)) == 3


@pytest.mark.parametrize("flag,value", [("--goal", "nan"), ("--goal", "inf"), ("--goal", "0.5"),
                                        ("--verify-cost", "-1"), ("--verify-cost", "nan"), ("--verify-cost", "0")])
def test_an_impossible_goal_or_verify_cost_is_a_named_error(
    forecast_runs: dict[str, Path], flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = sorted(forecast_runs["runs"].glob("run-*"))
    argv = ["forecast", *[a for r in runs for a in ("--run", str(r))], "--goal", "3.0", flag, value]
    assert main(argv) == 1
    err = capsys.readouterr().err.replace("\n", " ")
    assert f"{flag} is" in err and "unexpected" not in err


@pytest.mark.parametrize("text", [
    "[1, 2]", '{"concurrency": [1]}', '{"concurrency": {"1": 5}}', '{"concurrency": {"x": {}}}',
    '{"concurrency": {"1": {"acceptance_length": "2.1", "speedup": 1.0}}}',
    '{"concurrency": {"1": {"acceptance_length": NaN, "speedup": 1.0}}}',
    '{"concurrency": {"1": {"acceptance_length": 2.1, "speedup": -0.9}}}', "\udcff not json",
    # sweep item 8: a break-even past every float, and an acceptance under the verified token's 1
    '{"concurrency": {"1": {"acceptance_length": 1e308, "speedup": 1e-308}}}',
    '{"concurrency": {"1": {"acceptance_length": 0.5, "speedup": 1.0}}}',
])
def test_a_garbage_serve_report_is_a_named_error(
    forecast_runs: dict[str, Path], tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "serve.json"
    report.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match="serve.json"):
        fc.break_even_from_report(report)
    runs = sorted(forecast_runs["runs"].glob("run-*"))
    assert main(["forecast", *[a for r in runs for a in ("--run", str(r))], "--serve-report", str(report)]) == 1
    err = capsys.readouterr().err
    assert "serve.json" in err and "unexpected" not in err


@pytest.mark.parametrize("acceptance", [50, 4.01])
def test_a_served_acceptance_past_the_runs_chain_is_a_named_error(
    forecast_runs: dict[str, Path], tmp_path: Path, acceptance: float, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sweep item 8: acceptance_length 50 was taken beside runs with a chain of 3, whose own figures are
    held to [1, K + 1]."""
    report = tmp_path / "serve.json"
    report.write_text(json.dumps({"concurrency": {"1": {"acceptance_length": acceptance, "speedup": 1.2}}}))
    with pytest.raises(fc.BadServeReportError, match=r"acceptance_length .*\[1, 4\]"):
        fc.break_even_from_report(report, 3)
    assert fc.break_even_from_report(report)  # without a chain known, only [1, inf) holds
    runs = sorted(forecast_runs["runs"].glob("run-*"))
    assert main(["forecast", *[a for r in runs for a in ("--run", str(r))], "--serve-report", str(report)]) == 1
    err = capsys.readouterr().err
    assert "serve.json" in err and "acceptance_length" in err and "[1, 4]" in err and "unexpected" not in err


def test_a_served_acceptance_within_the_chain_is_taken(forecast_runs: dict[str, Path], tmp_path: Path) -> None:
    report = tmp_path / "serve.json"
    report.write_text(json.dumps({"concurrency": {"1": {"acceptance_length": 4, "speedup": 2.0}}}))
    (be,) = fc.break_even_from_report(report, 3)
    assert be.acceptance == pytest.approx(2.0)
    runs = sorted(forecast_runs["runs"].glob("run-*"))
    assert main(["forecast", *[a for r in runs for a in ("--run", str(r))], "--serve-report", str(report)]) == 0


def test_a_bad_serve_report_is_refused_before_any_draft_trains(forecast_runs: dict[str, Path], tmp_path: Path) -> None:
    report = tmp_path / "serve.json"
    report.write_text("[1, 2]")
    out = tmp_path / "runs"
    assert main([*forecast_runs["args"], "--out", str(out), "--serve-report", str(report)]) == 1
    assert not out.exists()


def test_a_forecast_sigkilled_in_its_last_run_resumes_to_the_figures_of_one_never_stopped(
    forecast_runs: dict[str, Path], tiny_target: Path, tmp_path: Path
) -> None:
    """issue 38 item 8, with a real SIGKILL: the process dies between two checkpoints of run-1."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file
    from training.train.checkpoint import latest_checkpoint

    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"draft_vocab_size": 512, "ttt_steps": 3, "global_batch_size": 2, "micro_batch_size": 2,
                               "max_steps": 40, "log_every": 1, "save_every": 2, "device": "cpu"}))
    args = ["forecast", "--store", str(forecast_runs["store"]), "--target", str(tiny_target),
            "--fractions", "0.25,0.5,1", "--config", str(cfg), "--goal", "3.0"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "curator", *args, "--out", str(killed)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 180
        while not (killed / "run-1" / "checkpoints" / "step-0000004" / "meta.json").exists():
            assert proc.poll() is None, "the forecast ended before it could be killed"
            assert time.monotonic() < deadline, "run-1 never reached its step-4 checkpoint"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (killed / "run-1" / "summary.json").exists()
    assert main([*args, "--out", str(killed), "--resume", "--json", str(tmp_path / "resumed.json")]) == 0
    assert main([*args, "--out", str(tmp_path / "whole"), "--json", str(tmp_path / "whole.json")]) == 0
    assert _points_of(tmp_path / "resumed.json") == _points_of(tmp_path / "whole.json")
    a, b = (load_file(str(latest_checkpoint(d / "run-1") / "draft.safetensors")) for d in (killed, tmp_path / "whole"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=1e-6) for k in a)


# ---- issue 46 item 6, issue 49 item 11: no "reached" from a handful, nothing left out unsaid, raw errors ----


def test_a_goal_met_by_a_handful_of_samples_is_not_called_reached() -> None:
    # the demo's reasoning: 3 training samples, acceptance past the goal (noise on as few held-out ones)
    pts = [fc.Point(1, 1.4), fc.Point(2, 2.0), fc.Point(3, 3.4)]
    out = fc.forecast_category("reasoning", pts, goal=3.0, steps=3)
    assert out.verdict == "too few samples" and out.needed is None
    assert f"from {fc.MIN_REACHED_SAMPLES:,} samples up" in out.reason and "3 training samples" in out.reason


def test_three_runs_no_line_fits_is_not_called_too_few_runs() -> None:
    # three sizes trained at one fixed step budget under an epoch: each draft saw 100 samples, so no line
    # tells the sizes apart (issue 49 item 11's "too few runs: 3 ... needs 3 or more")
    pts = [fc.Point(n, 1.5 + n / 2000, epochs=100 / n) for n in (250, 500, 1000)]
    out = fc.forecast_category("chat", pts, goal=3.9, steps=3)
    assert out.verdict == "no fit" and "needs 3 or more" not in out.reason and "same effective data" in out.reason


def test_a_category_no_run_measured_is_named_as_left_out() -> None:
    runs = [({"code": n, "chat": n // 2}, {"code": 1.5 + n / 1000}, None) for n in (250, 500, 1000)]
    assert set(fc.points_by_category(runs)) == {"code"}
    left = fc.left_out_categories(runs)
    assert list(left) == ["chat"] and "875 samples" in left["chat"] and "no held-out samples" in left["chat"]
    result = fc.make_forecast(fc.points_by_category(runs), 3.0, 3)
    result.left_out = left
    assert result.to_json()["left_out"] == left


def test_missing_runs_and_inputs_are_named_without_a_raw_errno(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forecast", "--run", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert "no such run directory" in err and "FileNotFoundError" not in err and "Errno" not in err
    (tmp_path / "stopped").mkdir()
    assert main(["forecast", "--run", str(tmp_path / "stopped")]) == 1
    err = capsys.readouterr().err
    assert "not a finished `curator train` run: no " in err and "summary.json" in err and "Errno" not in err
    assert main(["forecast", "--store", str(tmp_path / "nowhere"), "--target", str(tmp_path)]) == 1
    assert "--store" in capsys.readouterr().err
